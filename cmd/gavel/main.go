// Command gavel is Gavel's operator CLI: `gavel dev` runs a local cluster on an embedded etcd,
// and the other commands talk to a BBS.
//
//	gavel dev                         run embedded etcd and the BBS until Ctrl-C
//	gavel desire-lrp FILE.json        desire an LRP (protojson DesiredLRP)
//	gavel desire-task GUID DOMAIN FILE.json  desire a task (protojson TaskDefinition)
//	gavel lrps | actual-lrps | tasks | cells | tags | domains
//	gavel events [-since REV]         follow the event stream
//	gavel links [-cell C] [-json] GUID  print the resolution of the links an LRP consumes
//	gavel certs DIR NAME...           write a development CA and certificates
//	gavel apps | app push|scale|restart|stop | pools ...   apps and placement pools (nsync)
package main

import (
	"context"
	"errors"
	"flag"
	"fmt"
	"io"
	"os"

	"google.golang.org/grpc"
	"google.golang.org/protobuf/encoding/protojson"
	"google.golang.org/protobuf/proto"

	"github.com/gavel-sched/gavel/pkg/bbsclient"
	bbsv1 "github.com/gavel-sched/gavel/pkg/gen/gavel/bbs/v1"
	modelsv1 "github.com/gavel-sched/gavel/pkg/gen/gavel/models/v1"
	nsyncv1 "github.com/gavel-sched/gavel/pkg/gen/gavel/nsync/v1"
	"github.com/gavel-sched/gavel/pkg/grpcx"
	"github.com/gavel-sched/gavel/pkg/lifecycle"
	"github.com/gavel-sched/gavel/pkg/tlsx"
)

const usage = `usage: gavel [-bbs ADDR[,ADDR...]] [-nsync ADDR] [-tls-cert F -tls-key F -tls-ca F | -insecure] COMMAND [ARGS]

commands:
  dev                              run a local cluster (embedded etcd, BBS) until Ctrl-C
  desire-lrp FILE.json             desire an LRP from a protojson DesiredLRP ("-" reads stdin)
  desire-task GUID DOMAIN FILE     desire a task from a protojson TaskDefinition
  lrps [-domain D] [-selector S]   list desired LRPs
  actual-lrps [-domain D] [-cell C] [-selector S]
                                   list actual LRPs
  tasks [-domain D] [-cell C]      list tasks
  cells | tags | domains           list cells, placement tags, fresh domains
  events [-since REV]              follow the event stream (one JSON line per revision)
  links [-cell C] [-json] GUID     the resolution of the links an LRP consumes (table or JSON)
  certs DIR NAME...                write a development CA and one certificate per NAME

apps and placement pools (talk to nsync at -nsync):
` + appsUsage + poolsUsage

func main() {
	if err := run(os.Args[1:], os.Stdout); err != nil {
		fmt.Fprintln(os.Stderr, "gavel:", err)
		os.Exit(1)
	}
}

type globals struct {
	bbs   string
	nsync string
	tls   tlsx.Config
}

func run(args []string, out io.Writer) error {
	var g globals
	fs := flag.NewFlagSet("gavel", flag.ContinueOnError)
	fs.Usage = func() { fmt.Fprint(fs.Output(), usage) }
	fs.StringVar(&g.bbs, "bbs", bbsclient.DefaultAddress, "BBS gRPC address, or several comma-separated BBS addresses")
	fs.StringVar(&g.nsync, "nsync", "127.0.0.1:8895", "nsync gRPC address (apps, app, pools)")
	fs.StringVar(&g.tls.CertFile, "tls-cert", "", "client certificate (PEM)")
	fs.StringVar(&g.tls.KeyFile, "tls-key", "", "client key (PEM)")
	fs.StringVar(&g.tls.CAFile, "tls-ca", "", "CA of the BBS certificate (PEM)")
	fs.BoolVar(&g.tls.Insecure, "insecure", false, "plaintext gRPC (what `gavel dev` serves)")
	if err := fs.Parse(args); err != nil {
		return err
	}
	if fs.NArg() == 0 {
		fs.Usage()
		return errors.New("a command is required")
	}
	cmd, rest := fs.Arg(0), fs.Args()[1:]
	switch cmd {
	case "dev":
		return runDev(rest, out)
	case "certs":
		if len(rest) < 2 {
			return errors.New("usage: gavel certs DIR NAME...")
		}
		cfgs, err := tlsx.GenerateDevPKI(rest[0], rest[1:]...)
		if err != nil {
			return err
		}
		for _, n := range rest[1:] {
			fmt.Fprintf(out, "%s: cert %s key %s ca %s\n", n, cfgs[n].CertFile, cfgs[n].KeyFile, cfgs[n].CAFile)
		}
		return nil
	}
	ctx, stop := lifecycle.SignalContext(context.Background())
	defer stop()
	switch cmd {
	case "apps", "app", "pools":
		conn, err := grpcx.Dial(g.nsync, grpcx.ClientConfig{TLS: g.tls})
		if err != nil {
			return err
		}
		defer conn.Close()
		c := nsyncv1.NewNsyncServiceClient(conn)
		switch cmd {
		case "apps":
			return appsCommand(ctx, c, rest, out)
		case "app":
			return appCommand(ctx, c, rest, out)
		default:
			return poolsCommand(ctx, c, rest, out)
		}
	}
	conn, err := bbsclient.Dial(bbsclient.Config{BBSAddress: g.bbs, BBSTLS: g.tls})
	if err != nil {
		return err
	}
	defer conn.Close()
	if cmd == "links" {
		return runLinks(ctx, bbsv1.NewBBSServiceClient(conn), rest, out)
	}
	return clientCommand(ctx, bbsv1.NewBBSServiceClient(conn), cmd, rest, out)
}

func clientCommand(ctx context.Context, c bbsv1.BBSServiceClient, cmd string, args []string, out io.Writer) error {
	fs := flag.NewFlagSet(cmd, flag.ContinueOnError)
	var f bbsv1.Filter
	fs.StringVar(&f.Domain, "domain", "", "only this domain")
	fs.StringVar(&f.CellId, "cell", "", "only this cell")
	fs.StringVar(&f.LabelSelector, "selector", "", "label selector, e.g. app=web,tier!=db")
	since := fs.Int64("since", 0, "resume the event stream after this revision")
	if err := fs.Parse(args); err != nil {
		return err
	}
	var resp proto.Message
	var err error
	switch cmd {
	case "desire-lrp":
		var d modelsv1.DesiredLRP
		if err := readJSON(fs.Arg(0), &d); err != nil {
			return err
		}
		resp, err = c.DesireLRP(ctx, &bbsv1.DesireLRPRequest{DesiredLrp: &d})
	case "desire-task":
		if fs.NArg() != 3 {
			return errors.New("usage: gavel desire-task GUID DOMAIN FILE.json")
		}
		var def modelsv1.TaskDefinition
		if err := readJSON(fs.Arg(2), &def); err != nil {
			return err
		}
		resp, err = c.DesireTask(ctx, &bbsv1.DesireTaskRequest{TaskGuid: fs.Arg(0), Domain: fs.Arg(1), Definition: &def})
	case "lrps":
		resp, err = c.DesiredLRPs(ctx, &bbsv1.DesiredLRPsRequest{Filter: &f})
	case "actual-lrps":
		resp, err = c.ActualLRPs(ctx, &bbsv1.ActualLRPsRequest{Filter: &f})
	case "tasks":
		resp, err = c.Tasks(ctx, &bbsv1.TasksRequest{Filter: &f})
	case "cells":
		resp, err = c.Cells(ctx, &bbsv1.CellsRequest{})
	case "tags":
		resp, err = c.Tags(ctx, &bbsv1.TagsRequest{})
	case "domains":
		resp, err = c.Domains(ctx, &bbsv1.DomainsRequest{})
	case "events":
		return follow(ctx, c, &bbsv1.SubscribeToEventsRequest{SinceRevision: *since, Filter: &f}, out)
	default:
		return fmt.Errorf("unknown command %q (gavel -h lists them)", cmd)
	}
	if err != nil {
		return err
	}
	return printJSON(out, resp, true)
}

func follow(ctx context.Context, c bbsv1.BBSServiceClient, req *bbsv1.SubscribeToEventsRequest, out io.Writer) error {
	stream, err := c.SubscribeToEvents(ctx, req, grpc.WaitForReady(true))
	if err != nil {
		return err
	}
	for {
		msg, err := stream.Recv()
		if err != nil {
			if ctx.Err() != nil {
				return nil
			}
			return err
		}
		if err := printJSON(out, msg, false); err != nil {
			return err
		}
	}
}

func readJSON(path string, m proto.Message) error {
	var b []byte
	var err error
	if path == "-" {
		b, err = io.ReadAll(os.Stdin)
	} else {
		b, err = os.ReadFile(path)
	}
	if err != nil {
		return err
	}
	if err := protojson.Unmarshal(b, m); err != nil {
		return fmt.Errorf("parse %s: %w", path, err)
	}
	return nil
}

func printJSON(out io.Writer, m proto.Message, indent bool) error {
	opts := protojson.MarshalOptions{}
	if indent {
		opts.Multiline, opts.Indent = true, "  "
	}
	b, err := opts.Marshal(m)
	if err != nil {
		return err
	}
	_, err = fmt.Fprintln(out, string(b))
	return err
}
