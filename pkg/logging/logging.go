// Package logging builds the hclog loggers used by every Gavel component:
// named per component, key/value fields, text for humans and JSON for
// deployments. Tests log through package logtest, which only tests import, so
// that no service binary links package testing.
package logging

import (
	"fmt"
	"io"
	"os"
	"strings"

	"github.com/hashicorp/go-hclog"
)

// Supported values of Config.Level.
var levels = map[string]hclog.Level{
	"trace": hclog.Trace,
	"debug": hclog.Debug,
	"info":  hclog.Info,
	"warn":  hclog.Warn,
	"error": hclog.Error,
}

// Supported values of Config.Format.
const (
	// FormatText writes human-readable single-line entries.
	FormatText = "text"
	// FormatJSON writes one JSON object per entry.
	FormatJSON = "json"
)

// Config describes how a component logs.
type Config struct {
	// Level is the minimum level written: trace, debug, info, warn or error
	// (case-insensitive). Empty means info.
	Level string `json:"level"`
	// Format is "text" (the default when empty) or "json".
	Format string `json:"format"`
	// Output receives the log entries. Nil means os.Stderr.
	Output io.Writer `json:"-"`
}

// Validate reports whether the level and format are supported.
func (c Config) Validate() error {
	if _, err := ParseLevel(c.Level); err != nil {
		return fmt.Errorf("logging config: %w", err)
	}
	switch strings.ToLower(c.Format) {
	case "", FormatText, FormatJSON:
	default:
		return fmt.Errorf("logging config: format %q: want %q or %q", c.Format, FormatText, FormatJSON)
	}
	return nil
}

// New returns a logger named name configured by cfg. It expects a validated
// Config; an unknown level falls back to info and an unknown format to text.
func New(name string, cfg Config) hclog.Logger {
	level, err := ParseLevel(cfg.Level)
	if err != nil {
		level = hclog.Info
	}
	out := cfg.Output
	if out == nil {
		out = os.Stderr
	}
	return hclog.New(&hclog.LoggerOptions{
		Name:       name,
		Level:      level,
		Output:     out,
		JSONFormat: strings.EqualFold(cfg.Format, FormatJSON),
	})
}

// ParseLevel maps a level name (as Config.Level takes it) to an hclog level; empty means
// info.
func ParseLevel(s string) (hclog.Level, error) {
	if s == "" {
		return hclog.Info, nil
	}
	l, ok := levels[strings.ToLower(strings.TrimSpace(s))]
	if !ok {
		return hclog.NoLevel, fmt.Errorf("level %q: want one of trace, debug, info, warn, error", s)
	}
	return l, nil
}
