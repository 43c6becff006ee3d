package main

import (
	"errors"
	"fmt"
	"io"
	"time"

	"github.com/spf13/cobra"
	"google.golang.org/grpc"
	"google.golang.org/protobuf/types/known/timestamppb"

	bbsv1 "github.com/gavel-sched/gavel/pkg/gen/gavel/bbs/v1"
	repv1 "github.com/gavel-sched/gavel/pkg/gen/gavel/rep/v1"
)

// logsCommand is `gavel logs`: an LRP's (or a task's) log lines through the BBS, which proxies
// them from the cells (cf logs, kubectl logs).
func (c *cli) logsCommand() *cobra.Command {
	var (
		index  int32
		tail   int32
		since  time.Duration
		follow bool
		task   bool
	)
	cmd := &cobra.Command{
		Use:   "logs GUID",
		Short: "Show an LRP's log lines (all instances, or --index N), or a task's with --task; -f follows",
		Args:  cobra.ExactArgs(1),
		RunE: func(cmd *cobra.Command, args []string) error {
			p, bbs, err := c.clients()
			if err != nil {
				return err
			}
			req := &bbsv1.StreamLogsRequest{Follow: follow}
			if task {
				req.TaskGuid = args[0]
			} else {
				req.ProcessGuid = args[0]
			}
			if cmd.Flags().Changed("index") {
				req.Index = &index
			}
			if cmd.Flags().Changed("tail") {
				req.Tail = &tail
			}
			if since > 0 {
				req.Since = timestamppb.New(time.Now().Add(-since))
			}
			stream, err := bbs.StreamLogs(cmd.Context(), req, grpc.WaitForReady(true))
			if err != nil {
				return err
			}
			for {
				msg, err := stream.Recv()
				if err != nil {
					if cmd.Context().Err() != nil || errors.Is(err, io.EOF) {
						return nil
					}
					return err
				}
				if p.format == formatJSON {
					b, err := docJSON(msg)
					if err != nil {
						return err
					}
					fmt.Fprintf(c.out, "%s\n", b)
					continue
				}
				for _, l := range msg.GetLines() {
					fmt.Fprintln(c.out, logLine(l))
				}
			}
		},
	}
	cmd.Flags().Int32Var(&index, "index", 0, "only this instance index")
	cmd.Flags().Int32Var(&tail, "tail", 0, "only the last N lines each cell keeps (then new ones with -f)")
	cmd.Flags().DurationVar(&since, "since", 0, "only lines of the last DURATION, e.g. 5m")
	cmd.Flags().BoolVarP(&follow, "follow", "f", false, "keep streaming new lines")
	cmd.Flags().BoolVar(&task, "task", false, "GUID is a task guid")
	return cmd
}

// logLine is a log line as cf logs prints one: time, [SOURCE/INDEX], OUT or ERR, text.
func logLine(l *repv1.LogLine) string {
	stream := "OUT"
	if l.GetStream() == repv1.LogStream_LOG_STREAM_STDERR {
		stream = "ERR"
	}
	return fmt.Sprintf("%s [%s/%d] %s %s", l.GetTimestamp().AsTime().Local().Format("2006-01-02T15:04:05.00-0700"),
		l.GetSource(), l.GetIndex(), stream, l.GetText())
}
