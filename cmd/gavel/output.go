package main

import (
	"bytes"
	"fmt"
	"io"
	"os"
	"strings"
	"text/tabwriter"
	"time"

	"golang.org/x/term"
	"google.golang.org/protobuf/proto"
	"google.golang.org/protobuf/types/known/timestamppb"
)

// Output formats (-o).
const (
	formatTable = ""
	formatWide  = "wide"
	formatJSON  = "json"
	formatYAML  = "yaml"
)

// nowFunc is the clock of ages (tests fix it).
var nowFunc = time.Now

// printer renders command results in the chosen format.
type printer struct {
	out    io.Writer
	format string
	color  bool
	now    func() time.Time
}

// newPrinter checks the format; colour is on only for a terminal without NO_COLOR.
func newPrinter(out io.Writer, format string) (*printer, error) {
	switch format {
	case formatTable, formatWide, formatJSON, formatYAML:
	default:
		return nil, usageErrorf("output format %q: want json, yaml or wide", format)
	}
	color := false
	if f, ok := out.(*os.File); ok && term.IsTerminal(int(f.Fd())) && os.Getenv("NO_COLOR") == "" {
		color = true
	}
	return &printer{out: out, format: format, color: color, now: nowFunc}, nil
}

// structured reports whether the format is JSON or YAML.
func (p *printer) structured() bool { return p.format == formatJSON || p.format == formatYAML }

// wide reports whether -o wide was asked for.
func (p *printer) wide() bool { return p.format == formatWide }

// doc prints m as JSON or YAML (see docJSON for routesPaths).
func (p *printer) doc(m proto.Message, routesPaths ...string) error {
	b, err := docJSON(m, routesPaths...)
	if err != nil {
		return err
	}
	if p.format == formatYAML {
		if b, err = jsonToYAML(b); err != nil {
			return err
		}
		_, err = p.out.Write(b)
		return err
	}
	_, err = fmt.Fprintf(p.out, "%s\n", b)
	return err
}

// table is a table under construction; a column may be coloured per cell.
type table struct {
	p       *printer
	headers []string
	rows    [][]cell
}

// cell is one table cell and its colour (an ANSI SGR code, or "" for none).
type cell struct {
	text, color string
}

// ANSI colours of states.
const (
	green  = "32"
	yellow = "33"
	red    = "31"
	cyan   = "36"
)

func (p *printer) table(headers ...string) *table {
	return &table{p: p, headers: headers}
}

// row appends a row; values are strings or cells.
func (t *table) row(values ...any) {
	r := make([]cell, len(values))
	for i, v := range values {
		switch v := v.(type) {
		case cell:
			r[i] = v
		case string:
			r[i] = cell{text: v}
		default:
			r[i] = cell{text: fmt.Sprint(v)}
		}
	}
	t.rows = append(t.rows, r)
}

// flush writes the table, aligned. A column with any coloured cell gets colour codes of the
// same length in every cell, so tabwriter's alignment is kept.
func (t *table) flush() error {
	colored := make([]bool, len(t.headers))
	if t.p.color {
		for _, r := range t.rows {
			for i, c := range r {
				if c.color != "" && i < len(colored) {
					colored[i] = true
				}
			}
		}
	}
	w := tabwriter.NewWriter(t.p.out, 0, 4, 2, ' ', 0)
	line := func(cells []cell) {
		parts := make([]string, len(cells))
		for i, c := range cells {
			text := c.text
			if text == "" {
				text = "-"
			}
			if i < len(colored) && colored[i] {
				code := c.color
				if code == "" {
					code = "39"
				}
				text = "\x1b[" + code + "m" + text + "\x1b[0m"
			}
			parts[i] = text
		}
		fmt.Fprintln(w, strings.Join(parts, "\t"))
	}
	hs := make([]cell, len(t.headers))
	for i, h := range t.headers {
		hs[i] = cell{text: h}
	}
	line(hs)
	for _, r := range t.rows {
		line(r)
	}
	return w.Flush()
}

// age renders the time since ts as a short human duration ("45s", "3m", "2h", "4d").
func (p *printer) age(ts *timestamppb.Timestamp) string {
	if ts == nil || !ts.IsValid() || ts.AsTime().IsZero() {
		return ""
	}
	return humanDuration(p.now().Sub(ts.AsTime()))
}

// humanDuration renders d like kubectl's ages.
func humanDuration(d time.Duration) string {
	switch {
	case d < 0:
		return "0s"
	case d < 2*time.Minute:
		return fmt.Sprintf("%ds", int(d.Seconds()))
	case d < 2*time.Hour:
		return fmt.Sprintf("%dm", int(d.Minutes()))
	case d < 48*time.Hour:
		return fmt.Sprintf("%dh", int(d.Hours()))
	default:
		return fmt.Sprintf("%dd", int(d.Hours()/24))
	}
}

// join renders a list for a table cell.
func join(items []string) string { return strings.Join(items, ",") }

// mapString renders a string map as sorted k=v pairs.
func mapString(m map[string]string) string {
	keys := sortedKeys(m)
	parts := make([]string, len(keys))
	for i, k := range keys {
		parts[i] = k + "=" + m[k]
	}
	return strings.Join(parts, ",")
}

// captured runs render into a buffer (for --watch, which prints only changes).
func (p *printer) captured(render func(*printer) error) ([]byte, error) {
	var buf bytes.Buffer
	q := *p
	q.out = &buf
	err := render(&q)
	return buf.Bytes(), err
}
