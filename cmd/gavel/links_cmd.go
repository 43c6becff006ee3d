package main

import (
	"github.com/spf13/cobra"
)

// linksCommand is `gavel links GUID`: the resolution of the links an LRP consumes (runLinks),
// as a table or, with -o json, the JSON its containers receive in GAVEL_LINKS.
func (c *cli) linksCommand() *cobra.Command {
	var cell string
	cmd := &cobra.Command{
		Use:               "links GUID",
		Short:             "Show the resolution of the links an LRP consumes (table, or -o json as GAVEL_LINKS)",
		Args:              cobra.ExactArgs(1),
		ValidArgsFunction: c.completeFrom(processGuids),
		RunE: func(cmd *cobra.Command, args []string) error {
			p, bbs, err := c.clients()
			if err != nil {
				return err
			}
			var flags []string
			if cell != "" {
				flags = append(flags, "-cell", cell)
			}
			switch p.format {
			case formatJSON:
				flags = append(flags, "-json")
			case formatTable, formatWide:
			default:
				return usageErrorf("links prints a table or -o json")
			}
			return runLinks(cmd.Context(), bbs, append(flags, args[0]), c.out)
		},
	}
	cmd.Flags().StringVar(&cell, "cell", "", "resolve colocated links for an instance on this cell")
	return cmd
}
