package main

import (
	"context"
	"errors"
	"fmt"
	"io"
	"time"

	"github.com/spf13/cobra"
	"google.golang.org/grpc"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/status"
	"google.golang.org/protobuf/types/known/timestamppb"

	bbsv1 "github.com/gavel-sched/gavel/pkg/gen/gavel/bbs/v1"
	nsyncv1 "github.com/gavel-sched/gavel/pkg/gen/gavel/nsync/v1"
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
		Short: "Show an LRP's or an app's log lines (all instances, or --index N), or a task's with --task; -f follows",
		Args:  cobra.ExactArgs(1),
		RunE: func(cmd *cobra.Command, args []string) error {
			p, bbs, err := c.clients()
			if err != nil {
				return err
			}
			req := &bbsv1.StreamLogsRequest{Follow: follow}
			app := ""
			if task {
				req.TaskGuid = args[0]
			} else {
				req.ProcessGuid, app = c.resolveApp(cmd.Context(), bbs, args[0])
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
			// Following an LRP goes on across its instances' moves: when the BBS ends the
			// stream (no cell holds a selected instance any more), it is opened again from the
			// last line seen, until the LRP is removed or Ctrl-C.
			start := time.Now()
			for reopened := false; ; reopened = true {
				last, err := c.printLogs(cmd.Context(), p, bbs, req, reopened)
				if err != nil || !follow || task || cmd.Context().Err() != nil {
					return err
				}
				switch {
				case last != nil:
					req.Since = timestamppb.New(last.AsTime().Add(time.Nanosecond))
				case req.GetSince() == nil || req.GetSince().AsTime().Before(start):
					req.Since = timestamppb.New(start)
				}
				req.Tail = nil
				if app != "" {
					// An app's restart or deployment serves a new LRP: follow it.
					req.ProcessGuid, _ = c.resolveApp(cmd.Context(), bbs, app)
				}
				if !c.lrpExists(cmd.Context(), bbs, req.GetProcessGuid()) {
					return nil
				}
				select {
				case <-cmd.Context().Done():
					return nil
				case <-time.After(followReopen):
				}
			}
		},
	}
	cmd.Flags().Int32Var(&index, "index", 0, "only this instance index")
	cmd.Flags().Int32Var(&tail, "tail", 0, "only the last N lines, over all the instances selected (then new ones with -f)")
	cmd.Flags().DurationVar(&since, "since", 0, "only lines of the last DURATION, e.g. 5m")
	cmd.Flags().BoolVarP(&follow, "follow", "f", false, "keep streaming new lines")
	cmd.Flags().BoolVar(&task, "task", false, "GUID is a task guid")
	return cmd
}

// followReopen is how long `gavel logs -f` waits before opening the stream of an LRP again.
const followReopen = time.Second

// printLogs prints one StreamLogs stream to its end and returns the timestamp of the last line
// (nil when none came). A clean end and the client's own end are no error, nor, when reopened
// is set (following again), NotFound: no instance is on a cell right now.
func (c *cli) printLogs(ctx context.Context, p *printer, bbs bbsv1.BBSServiceClient, req *bbsv1.StreamLogsRequest, reopened bool) (*timestamppb.Timestamp, error) {
	var last *timestamppb.Timestamp
	stream, err := bbs.StreamLogs(ctx, req, grpc.WaitForReady(true))
	if err != nil {
		return nil, err
	}
	for {
		msg, err := stream.Recv()
		if err != nil {
			switch {
			case ctx.Err() != nil || errors.Is(err, io.EOF):
				return last, nil
			case status.Code(err) == codes.NotFound && reopened:
				return last, nil // following: the instances are between cells
			}
			return last, err
		}
		if n := len(msg.GetLines()); n > 0 {
			last = msg.GetLines()[n-1].GetTimestamp()
		}
		if p.format == formatJSON {
			b, err := docJSON(msg)
			if err != nil {
				return last, err
			}
			fmt.Fprintf(c.out, "%s\n", b)
			continue
		}
		for _, l := range msg.GetLines() {
			fmt.Fprintln(c.out, logLine(l))
		}
	}
}

// resolveApp is the process guid of guid: guid itself when the BBS has such a desired LRP,
// else, when nsync knows an app of that guid, the LRP serving it (and the app guid as app, so a
// follower can resolve it again); else guid, for the BBS to answer NotFound.
func (c *cli) resolveApp(ctx context.Context, bbs bbsv1.BBSServiceClient, guid string) (processGuid, app string) {
	if c.lrpExists(ctx, bbs, guid) {
		return guid, ""
	}
	ns, err := c.nsyncClient()
	if err != nil {
		return guid, ""
	}
	ctx, cancel := context.WithTimeout(ctx, 5*time.Second)
	defer cancel()
	resp, err := ns.Apps(ctx, &nsyncv1.AppsRequest{Guids: []string{guid}})
	if err != nil || len(resp.GetApps()) != 1 || resp.GetApps()[0].GetProcessGuid() == "" {
		return guid, ""
	}
	return resp.GetApps()[0].GetProcessGuid(), guid
}

// lrpExists reports whether the desired LRP guid still exists (true when the BBS cannot say).
func (c *cli) lrpExists(ctx context.Context, bbs bbsv1.BBSServiceClient, guid string) bool {
	_, err := bbs.DesiredLRPByProcessGuid(ctx, &bbsv1.DesiredLRPByProcessGuidRequest{ProcessGuid: guid})
	return status.Code(err) != codes.NotFound
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
