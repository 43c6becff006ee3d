package main

import (
	"context"
	"errors"
	"fmt"
	"io"
	"os"
	"os/signal"
	"strconv"
	"strings"
	"syscall"

	"github.com/spf13/cobra"
	"golang.org/x/term"
	"google.golang.org/grpc"

	bbsv1 "github.com/gavel-sched/gavel/pkg/gen/gavel/bbs/v1"
	repv1 "github.com/gavel-sched/gavel/pkg/gen/gavel/rep/v1"
)

// accessCommands are `gavel top` and `gavel exec`: an LRP's instance metrics and a command in
// one of its instances, through the BBS, which asks (or proxies to) the cells (cf app / cf
// ssh, kubectl top / kubectl exec).
func (c *cli) accessCommands() []*cobra.Command {
	var (
		index int32
		task  bool
	)
	top := &cobra.Command{
		Use:               "top GUID",
		Short:             "Show the CPU, memory and disk use of an LRP's or an app's instances (or --index N), or a task's with --task",
		Args:              cobra.ExactArgs(1),
		ValidArgsFunction: c.completeFrom(processGuids),
		RunE: func(cmd *cobra.Command, args []string) error {
			p, bbs, err := c.clients()
			if err != nil {
				return err
			}
			req := &bbsv1.InstanceMetricsRequest{}
			if task {
				req.TaskGuid = args[0]
			} else {
				req.ProcessGuid, _ = c.resolveApp(cmd.Context(), bbs, args[0])
			}
			if cmd.Flags().Changed("index") {
				req.Index = &index
			}
			resp, err := bbs.InstanceMetrics(cmd.Context(), req)
			if err != nil {
				return err
			}
			if p.structured() {
				return p.doc(resp)
			}
			headers := []string{"INDEX", "STATE", "CPU", "MEMORY", "DISK", "CELL"}
			if p.wide() {
				headers = append(headers, "INSTANCE_GUID", "CPU_SECONDS", "SAMPLED")
			}
			t := p.table(headers...)
			for _, m := range resp.GetContainers() {
				cpu, mem, disk := metricsColumns(m)
				r := []any{m.GetIndex(), m.GetState(), cpu, mem, disk, m.GetCellId()}
				if p.wide() {
					r = append(r, m.GetInstanceGuid(), fmt.Sprintf("%.2f", m.GetCpuSeconds()), p.age(m.GetSampledAt()))
				}
				t.row(r...)
			}
			if err := t.flush(); err != nil {
				return err
			}
			if len(resp.GetUnreachable()) > 0 {
				fmt.Fprintf(c.err, "gavel: no answer from cell(s) %s\n", strings.Join(resp.GetUnreachable(), ", "))
			}
			return nil
		},
	}
	top.Flags().Int32Var(&index, "index", 0, "only this instance index")
	top.Flags().BoolVar(&task, "task", false, "GUID is a task guid")

	var interactive, tty bool
	execCmd := &cobra.Command{
		Use:   "exec GUID[/INDEX] [-i] [-t] -- COMMAND [ARG...]",
		Short: "Run a command in a running instance of an LRP or an app (index 0 unless given); -it for an interactive shell",
		Long: `Run a command in a running instance of an LRP, through the BBS, as the instance's own
processes run: its root filesystem, user, environment and limits. Admin only; every exec is
audited. -i sends this terminal's input; -t runs the command on a pseudo-terminal (with -i and a
terminal here, this one is put in raw mode and its size follows). gavel exits with the
command's exit status; errors before the command runs use the CLI's exit codes.`,
		Example: `  gavel exec hello/0 -- cat /proc/self/status
  gavel exec hello/1 -it -- /bin/sh`,
		Args: cobra.MinimumNArgs(2),
		RunE: func(cmd *cobra.Command, args []string) error {
			guid, idx, err := parseInstanceArg(args[0])
			if err != nil {
				return err
			}
			if cmd.ArgsLenAtDash() != 1 {
				return usageErrorf("exec: put the command after --, e.g. gavel exec %s -- /bin/sh", args[0])
			}
			_, bbs, err := c.clients()
			if err != nil {
				return err
			}
			guid, _ = c.resolveApp(cmd.Context(), bbs, guid)
			code, err := c.exec(cmd.Context(), bbs, &repv1.ExecStart{ProcessGuid: guid, Index: idx, Command: args[1:], Tty: tty}, interactive)
			if err != nil {
				return err
			}
			if code != 0 {
				return withExit(code, fmt.Errorf("command exited with status %d", code))
			}
			return nil
		},
	}
	execCmd.Flags().BoolVarP(&interactive, "stdin", "i", false, "send this terminal's input to the command")
	execCmd.Flags().BoolVarP(&tty, "tty", "t", false, "run the command on a pseudo-terminal")
	return []*cobra.Command{top, execCmd}
}

// parseInstanceArg splits GUID[/INDEX].
func parseInstanceArg(s string) (string, int32, error) {
	guid, idx, ok := strings.Cut(s, "/")
	if !ok {
		return s, 0, nil
	}
	n, err := strconv.ParseInt(idx, 10, 32)
	if err != nil || n < 0 {
		return "", 0, usageErrorf("instance %q: want GUID/INDEX with a non-negative index", s)
	}
	return guid, int32(n), nil
}

// exec runs start through the BBS, copying its output to the CLI's and, with interactive, the
// CLI's input to it, and returns its exit code.
func (c *cli) exec(ctx context.Context, bbs bbsv1.BBSServiceClient, start *repv1.ExecStart, interactive bool) (int, error) {
	ctx, cancel := context.WithCancel(ctx)
	defer cancel()
	inFile, _ := c.stdin.(*os.File)
	localTTY := interactive && start.GetTty() && inFile != nil && term.IsTerminal(int(inFile.Fd()))
	if localTTY {
		if w, h, err := term.GetSize(int(inFile.Fd())); err == nil {
			start.Size = &repv1.TerminalSize{Rows: uint32(h), Cols: uint32(w)}
		}
	}
	stream, err := bbs.Exec(ctx, grpc.WaitForReady(true))
	if err != nil {
		return 0, err
	}
	if err := stream.Send(&bbsv1.ExecRequest{Start: start}); err != nil {
		if errors.Is(err, io.EOF) {
			// The BBS ended the stream already (a refusal, a bad request): its status says why,
			// and Recv has it.
			if _, rerr := stream.Recv(); rerr != nil && !errors.Is(rerr, io.EOF) {
				err = rerr
			}
		}
		return 0, err
	}
	if localTTY {
		old, err := term.MakeRaw(int(inFile.Fd()))
		if err == nil {
			defer func() { _ = term.Restore(int(inFile.Fd()), old) }()
		}
		winch := make(chan os.Signal, 1)
		signal.Notify(winch, syscall.SIGWINCH)
		defer signal.Stop(winch)
		go func() {
			for {
				select {
				case <-winch:
					if w, h, err := term.GetSize(int(inFile.Fd())); err == nil {
						_ = stream.Send(&bbsv1.ExecRequest{Resize: &repv1.TerminalSize{Rows: uint32(h), Cols: uint32(w)}})
					}
				case <-ctx.Done():
					return
				}
			}
		}()
	}
	if interactive {
		go func() {
			buf := make([]byte, 32<<10)
			for {
				n, err := c.stdin.Read(buf)
				if n > 0 {
					if stream.Send(&bbsv1.ExecRequest{Stdin: append([]byte(nil), buf[:n]...)}) != nil {
						return
					}
				}
				if err != nil {
					_ = stream.CloseSend() // the end of input
					return
				}
			}
		}()
	} else {
		_ = stream.CloseSend()
	}
	for {
		m, err := stream.Recv()
		if errors.Is(err, io.EOF) {
			return 0, errors.New("exec: the stream ended without the command's exit status")
		}
		if err != nil {
			return 0, err
		}
		if len(m.GetStdout()) > 0 {
			_, _ = c.out.Write(m.GetStdout())
		}
		if len(m.GetStderr()) > 0 {
			_, _ = c.err.Write(m.GetStderr())
		}
		if m.ExitCode != nil {
			return int(m.GetExitCode()), nil
		}
	}
}

// metricsColumns renders a sample as cf app does: "12.3%", "48.2M of 256M", "1.1M of 1G"; a
// container not sampled yet shows "-".
func metricsColumns(m *repv1.ContainerMetrics) (cpu, mem, disk string) {
	if m.GetSampledAt() == nil {
		return "-", "-", "-"
	}
	return fmt.Sprintf("%.1f%%", m.GetCpuPercent()), ofLimit(m.GetMemoryBytes(), m.GetMemoryLimitBytes()),
		ofLimit(m.GetDiskBytes(), m.GetDiskLimitBytes())
}

// ofLimit renders "used of limit" (just "used" without a limit).
func ofLimit(used, limit uint64) string {
	if limit == 0 {
		return bytesString(used)
	}
	return bytesString(used) + " of " + bytesString(limit)
}

// bytesString renders a size in binary units with one decimal: 512K, 48.2M, 1G.
func bytesString(n uint64) string {
	units := []string{"B", "K", "M", "G", "T"}
	v, u := float64(n), 0
	for v >= 1024 && u < len(units)-1 {
		v /= 1024
		u++
	}
	s := strconv.FormatFloat(v, 'f', 1, 64)
	s = strings.TrimSuffix(s, ".0")
	return s + units[u]
}

// instanceMetrics is the latest resource sample of an LRP's instances by instance guid, for
// `gavel lrp`; nil when the BBS cannot say (no instance on a cell, a cell not answering, an
// older BBS), so the listing goes on without the columns.
func instanceMetrics(ctx context.Context, bbs bbsv1.BBSServiceClient, guid string) map[string]*repv1.ContainerMetrics {
	ms := lrpMetrics(ctx, bbs, guid)
	if ms == nil {
		return nil
	}
	out := make(map[string]*repv1.ContainerMetrics, len(ms))
	for _, m := range ms {
		out[m.GetInstanceGuid()] = m
	}
	return out
}

// lrpMetrics is the latest resource sample of each of an LRP's containers, by index (as the
// BBS orders them); nil when the BBS cannot say.
func lrpMetrics(ctx context.Context, bbs bbsv1.BBSServiceClient, guid string) []*repv1.ContainerMetrics {
	resp, err := bbs.InstanceMetrics(ctx, &bbsv1.InstanceMetricsRequest{ProcessGuid: guid})
	if err != nil {
		return nil
	}
	return resp.GetContainers()
}
