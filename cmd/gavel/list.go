package main

import (
	"bytes"
	"time"

	"github.com/spf13/cobra"

	bbsv1 "github.com/gavel-sched/gavel/pkg/gen/gavel/bbs/v1"
)

// watchFlags binds --watch and --interval on list commands.
type watchFlags struct {
	watch    bool
	interval time.Duration
}

func (w *watchFlags) bind(cmd *cobra.Command) {
	cmd.Flags().BoolVarP(&w.watch, "watch", "w", false, "keep listing: print the list again whenever it changes")
	cmd.Flags().DurationVar(&w.interval, "interval", 2*time.Second, "how often --watch reads the list")
}

// listBBS is list of a render that reads the BBS.
func (c *cli) listBBS(cmd *cobra.Command, w watchFlags, render func(*printer, bbsv1.BBSServiceClient) error) error {
	return c.list(cmd, w, func(p *printer) error {
		bbs, err := c.bbsClient()
		if err != nil {
			return err
		}
		return render(p, bbs)
	})
}

// list renders once, or with --watch renders every interval and prints each result that differs
// from the last one (separated by a blank line) until interrupted.
func (c *cli) list(cmd *cobra.Command, w watchFlags, render func(*printer) error) error {
	p, err := c.printer()
	if err != nil {
		return err
	}
	if !w.watch {
		return render(p)
	}
	var last []byte
	first := true
	for {
		out, err := p.captured(render)
		if err != nil {
			if cmd.Context().Err() != nil {
				return nil
			}
			return err
		}
		if !bytes.Equal(out, last) {
			if !first {
				c.out.Write([]byte("\n"))
			}
			c.out.Write(out)
			last, first = out, false
		}
		select {
		case <-cmd.Context().Done():
			return nil
		case <-time.After(w.interval):
		}
	}
}
