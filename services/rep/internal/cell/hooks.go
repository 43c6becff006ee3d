package cell

import (
	"bytes"
	"context"
	"fmt"
	"os"
	"os/exec"
	"strings"

	"github.com/gavel-sched/gavel/services/rep/internal/executor"
)

// Hook events, passed to hooks in GAVEL_HOOK.
const (
	hookOnCreate  = "on_create"
	hookOnDestroy = "on_destroy"
)

// maxHookOutput bounds how much of a failing hook's output its error quotes.
const maxHookOutput = 1024

// runHooks runs each hook of an event in order with the spec's JSON on stdin and stops at the
// first failure; nothing when the backend runs the hooks itself (executor.HookRunner).
func (c *Cell) runHooks(ctx context.Context, event string, paths []string, spec executor.Spec) error {
	if len(paths) == 0 {
		return nil
	}
	if hr, ok := c.backend.(executor.HookRunner); ok && hr.RunsHooks() {
		return nil // the backend runs them in the container's lifecycle (oci: OCI hooks)
	}
	payload, err := HookPayload(spec)
	if err != nil {
		return err
	}
	for _, path := range paths {
		if err := c.runHook(ctx, event, path, spec.Guid, payload); err != nil {
			c.obs.HookFailed(event)
			return err
		}
	}
	return nil
}

// runHook runs one hook executable, bounded by the hook timeout.
func (c *Cell) runHook(ctx context.Context, event, path, guid string, payload []byte) error {
	ctx, cancel := context.WithTimeout(ctx, c.cfg.Hooks.Timeout)
	defer cancel()
	cmd := exec.CommandContext(ctx, path)
	cmd.Stdin = bytes.NewReader(payload)
	cmd.Env = append(os.Environ(), "GAVEL_HOOK="+event, "GAVEL_CONTAINER_GUID="+guid, "GAVEL_CELL_ID="+c.cfg.CellID)
	out := &cappedBuffer{max: 64 << 10}
	cmd.Stdout = out
	cmd.Stderr = out
	err := cmd.Run()
	if err != nil {
		if ctx.Err() != nil {
			err = fmt.Errorf("%w (%v)", err, ctx.Err())
		}
		text := strings.TrimSpace(out.String())
		if len(text) > maxHookOutput {
			text = "…" + text[len(text)-maxHookOutput:]
		}
		if text != "" {
			return fmt.Errorf("%s hook %s: %w: %s", event, path, err, text)
		}
		return fmt.Errorf("%s hook %s: %w", event, path, err)
	}
	c.log.Debug("hook ran", "hook", event, "path", path, "guid", guid)
	return nil
}

// cappedBuffer keeps the first max bytes written to it and discards the rest.
type cappedBuffer struct {
	bytes.Buffer
	max int
}

// Write implements io.Writer; it never fails, so a chatty hook is not broken by the cap.
func (b *cappedBuffer) Write(p []byte) (int, error) {
	if room := b.max - b.Len(); room > 0 {
		b.Buffer.Write(p[:min(room, len(p))])
	}
	return len(p), nil
}
