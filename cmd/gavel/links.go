package main

import (
	"context"
	"encoding/json"
	"errors"
	"flag"
	"fmt"
	"io"
	"maps"
	"slices"
	"sort"
	"strings"
	"text/tabwriter"

	bbsv1 "github.com/gavel-sched/gavel/pkg/gen/gavel/bbs/v1"
	"github.com/gavel-sched/gavel/pkg/links"
)

// linksUsage is the usage of `gavel links`.
const linksUsage = "usage: gavel links [-cell CELL] [-json] PROCESS_GUID"

// runLinks is `gavel links`: the resolution of the links PROCESS_GUID consumes, as a table (one
// row per node, then the properties) or as the JSON its containers receive in GAVEL_LINKS. With
// -cell, colocated links are resolved for an instance on that cell.
func runLinks(ctx context.Context, c bbsv1.BBSServiceClient, args []string, out io.Writer) error {
	fs := flag.NewFlagSet("links", flag.ContinueOnError)
	cell := fs.String("cell", "", "resolve colocated links for an instance on this cell")
	asJSON := fs.Bool("json", false, "print the JSON a container receives (GAVEL_LINKS)")
	if err := fs.Parse(args); err != nil {
		return err
	}
	if fs.NArg() != 1 {
		return errors.New(linksUsage)
	}
	guid := fs.Arg(0)
	d, err := c.DesiredLRPByProcessGuid(ctx, &bbsv1.DesiredLRPByProcessGuidRequest{ProcessGuid: guid})
	if err != nil {
		return err
	}
	resp, err := c.ResolveLinks(ctx, &bbsv1.ResolveLinksRequest{ProcessGuid: guid, CellId: *cell})
	if err != nil {
		return err
	}
	docs := links.Documents(links.FromDesired(d.GetDesiredLrp()), resp.GetLinks(), *cell)
	if *asJSON {
		b, err := json.MarshalIndent(docs, "", "  ")
		if err != nil {
			return err
		}
		_, err = fmt.Fprintln(out, string(b))
		return err
	}
	return printLinksTable(out, docs)
}

// printLinksTable prints one row per node of each link (a link without nodes gets one row of
// dashes) and then each link's properties.
func printLinksTable(out io.Writer, docs map[string]links.Document) error {
	names := make([]string, 0, len(docs))
	for n := range docs {
		names = append(names, n)
	}
	sort.Strings(names)
	w := tabwriter.NewWriter(out, 0, 4, 2, ' ', 0)
	fmt.Fprintln(w, "LINK\tINDEX\tID\tAZ\tADDRESS")
	for _, n := range names {
		d := docs[n]
		var nodes []links.Node
		if d.Nodes != nil {
			nodes = *d.Nodes
		}
		if d.Node != nil {
			nodes = []links.Node{*d.Node}
		}
		if len(nodes) == 0 {
			fmt.Fprintf(w, "%s\t-\t-\t-\t-\n", n)
		}
		for _, nd := range nodes {
			fmt.Fprintf(w, "%s\t%d\t%s\t%s\t%s\n", n, nd.Index, nd.ID, nd.AZ, nd.Address)
		}
	}
	if err := w.Flush(); err != nil {
		return err
	}
	for _, n := range names {
		props := docs[n].Properties
		if len(props) == 0 {
			continue
		}
		keys := slices.Sorted(maps.Keys(props))
		var parts []string
		for _, k := range keys {
			parts = append(parts, k+"="+props[k])
		}
		if _, err := fmt.Fprintf(out, "%s properties: %s\n", n, strings.Join(parts, " ")); err != nil {
			return err
		}
	}
	return nil
}
