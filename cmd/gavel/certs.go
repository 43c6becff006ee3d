package main

import (
	"fmt"

	"github.com/spf13/cobra"

	"github.com/gavel-sched/gavel/pkg/tlsx"
)

func (c *cli) certsCommand() *cobra.Command {
	var hosts []string
	cmd := &cobra.Command{
		Use:   "certs DIR NAME...",
		Short: "Write a development CA (reused when DIR has one) and a certificate per NAME",
		Long: `certs writes a development CA to DIR (ca.crt, ca.key; an existing one is reused) and, for
each NAME, NAME.crt and NAME.key with the identity spiffe://gavel/NAME (names may contain
slashes: rep/cell-1 writes DIR/rep/cell-1.crt). Every certificate is valid for localhost,
127.0.0.1 and ::1, and for each --host (the addresses peers dial, e.g. container IPs).

The services map spiffe://gavel/NAME to the role NAME by default: admin, read-only,
auctioneer, route-emitter, router, bbs, nsync, and rep/<cell> for the rep of <cell>.`,
		Example: "  gavel certs ./pki bbs auctioneer route-emitter router rep/cell-1 admin read-only\n  gavel certs --host 172.29.0.20 --host 172.29.0.21 ./pki bbs",
		Args:    cobra.MinimumNArgs(2),
		RunE: func(cmd *cobra.Command, args []string) error {
			cfgs, err := tlsx.GenerateDevPKIHosts(args[0], hosts, args[1:]...)
			if err != nil {
				return err
			}
			for _, n := range args[1:] {
				fmt.Fprintf(c.out, "%s: cert %s key %s ca %s\n", n, cfgs[n].CertFile, cfgs[n].KeyFile, cfgs[n].CAFile)
			}
			return nil
		},
	}
	cmd.Flags().StringArrayVar(&hosts, "host", nil, "an extra IP address or DNS name on every certificate (repeatable)")
	return cmd
}
