package main

import (
	"context"
	"flag"
	"fmt"
	"io"
	"strings"
	"text/tabwriter"

	"github.com/gavel-sched/gavel/pkg/config"
	nsyncv1 "github.com/gavel-sched/gavel/pkg/gen/gavel/nsync/v1"
)

// poolsCommand runs `gavel pools [create|update|delete|bind|unbind|default]`.
func poolsCommand(ctx context.Context, c nsyncv1.NsyncServiceClient, args []string, out io.Writer) error {
	if len(args) == 0 {
		return listPools(ctx, c, out)
	}
	sub, args := args[0], args[1:]
	var require, disallow []string
	fs := flag.NewFlagSet("pools "+sub, flag.ContinueOnError)
	fs.Var(config.List{Values: &require}, "require", "comma-separated tags every eligible cell carries")
	fs.Var(config.List{Values: &disallow}, "disallow", "comma-separated tags no eligible cell carries")
	force := fs.Bool("force", false, "delete: unbind the pool's spaces (and clear it as the default) first")
	// Flags may follow the positional arguments: `pools create prod -require production`.
	var pos []string
	for {
		if err := fs.Parse(args); err != nil {
			return err
		}
		if fs.NArg() == 0 {
			break
		}
		pos = append(pos, fs.Arg(0))
		args = fs.Args()[1:]
	}
	need := func(n int, usage string) error {
		if len(pos) != n {
			return fmt.Errorf("usage: gavel pools %s", usage)
		}
		return nil
	}
	var err error
	switch sub {
	case "create", "update":
		if err = need(1, sub+" NAME [-require T,T] [-disallow T,T]"); err != nil {
			return err
		}
		pool := &nsyncv1.PlacementPool{Name: pos[0], Require: require, Disallow: disallow}
		if sub == "create" {
			_, err = c.CreatePlacementPool(ctx, &nsyncv1.CreatePlacementPoolRequest{Pool: pool})
		} else {
			_, err = c.UpdatePlacementPool(ctx, &nsyncv1.UpdatePlacementPoolRequest{Pool: pool})
		}
	case "delete":
		if err = need(1, "delete [-force] NAME"); err != nil {
			return err
		}
		_, err = c.DeletePlacementPool(ctx, &nsyncv1.DeletePlacementPoolRequest{Name: pos[0], Force: *force})
	case "bind":
		if err = need(2, "bind SPACE POOL"); err != nil {
			return err
		}
		_, err = c.BindPlacementPool(ctx, &nsyncv1.BindPlacementPoolRequest{SpaceGuid: pos[0], Pool: pos[1]})
	case "unbind":
		if err = need(1, "unbind SPACE"); err != nil {
			return err
		}
		_, err = c.UnbindPlacementPool(ctx, &nsyncv1.UnbindPlacementPoolRequest{SpaceGuid: pos[0]})
	case "default":
		if len(pos) > 1 {
			return fmt.Errorf("usage: gavel pools default [POOL]")
		}
		name := ""
		if len(pos) == 1 {
			name = pos[0]
		}
		_, err = c.SetDefaultPlacementPool(ctx, &nsyncv1.SetDefaultPlacementPoolRequest{Pool: name})
	default:
		return fmt.Errorf("unknown pools command %q (create, update, delete, bind, unbind, default)", sub)
	}
	if err != nil {
		return err
	}
	return listPools(ctx, c, out)
}

// listPools prints the pools as a table.
func listPools(ctx context.Context, c nsyncv1.NsyncServiceClient, out io.Writer) error {
	resp, err := c.PlacementPools(ctx, &nsyncv1.PlacementPoolsRequest{})
	if err != nil {
		return err
	}
	w := tabwriter.NewWriter(out, 0, 4, 2, ' ', 0)
	fmt.Fprintln(w, "POOL\tREQUIRE\tDISALLOW\tSPACES\tDEFAULT")
	for _, p := range resp.GetPools() {
		def := ""
		if p.GetIsDefault() {
			def = "yes"
		}
		fmt.Fprintf(w, "%s\t%s\t%s\t%s\t%s\n", p.GetPool().GetName(), strings.Join(p.GetPool().GetRequire(), ","),
			strings.Join(p.GetPool().GetDisallow(), ","), strings.Join(p.GetSpaceGuids(), ","), def)
	}
	return w.Flush()
}
