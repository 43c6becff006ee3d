package main

import (
	"fmt"

	"github.com/spf13/cobra"

	"github.com/gavel-sched/gavel/pkg/tlsx"
)

func (c *cli) certsCommand() *cobra.Command {
	return &cobra.Command{
		Use:   "certs DIR NAME...",
		Short: "Write a development CA (reused when DIR has one) and a certificate per NAME",
		Long: `certs writes a development CA to DIR (ca.crt, ca.key; an existing one is reused) and, for
each NAME, NAME.crt and NAME.key with the identity spiffe://gavel/NAME (names may contain
slashes: rep/cell-1 writes DIR/rep/cell-1.crt).`,
		Example: "  gavel certs ./pki bbs auctioneer route-emitter router rep/cell-1 admin",
		Args:    cobra.MinimumNArgs(2),
		RunE: func(cmd *cobra.Command, args []string) error {
			cfgs, err := tlsx.GenerateDevPKI(args[0], args[1:]...)
			if err != nil {
				return err
			}
			for _, n := range args[1:] {
				fmt.Fprintf(c.out, "%s: cert %s key %s ca %s\n", n, cfgs[n].CertFile, cfgs[n].KeyFile, cfgs[n].CAFile)
			}
			return nil
		},
	}
}
