// Package config parses a service's flags over its JSON config file: defaults, then the file
// named by the config flag, then every flag given on the command line.
package config

import (
	"encoding/json"
	"flag"
	"fmt"
	"os"
	"strconv"
	"strings"
	"time"
)

// Parse parses args into fs. When the flag named fileFlag is set, load is called with its
// value and the explicitly given flags are applied again afterwards, so they override the file.
func Parse(fs *flag.FlagSet, args []string, fileFlag string, load func(path string) error) error {
	if err := fs.Parse(args); err != nil {
		return err
	}
	type setFlag struct{ name, value string }
	var given []setFlag
	path := ""
	fs.Visit(func(f *flag.Flag) {
		if f.Name == fileFlag {
			path = f.Value.String()
			return
		}
		given = append(given, setFlag{f.Name, f.Value.String()})
	})
	if path == "" {
		return nil
	}
	if err := load(path); err != nil {
		return err
	}
	for _, g := range given {
		if err := fs.Set(g.name, g.value); err != nil {
			return fmt.Errorf("flag -%s: %w", g.name, err)
		}
	}
	return nil
}

// List is a comma-separated list flag bound to a string slice.
type List struct{ Values *[]string }

// String implements flag.Value.
func (l List) String() string {
	if l.Values == nil {
		return ""
	}
	return strings.Join(*l.Values, ",")
}

// Set implements flag.Value: it replaces the list with the comma-separated items of s.
func (l List) Set(s string) error {
	var out []string
	for _, item := range strings.Split(s, ",") {
		if item = strings.TrimSpace(item); item != "" {
			out = append(out, item)
		}
	}
	*l.Values = out
	return nil
}

// JSONMap is a flag holding a JSON object of strings, e.g. '{"cflinuxfs4":"/path"}'.
type JSONMap struct{ Values *map[string]string }

// String implements flag.Value.
func (j JSONMap) String() string {
	if j.Values == nil || *j.Values == nil {
		return ""
	}
	b, _ := json.Marshal(*j.Values)
	return string(b)
}

// Set implements flag.Value: it replaces the map with the JSON object s.
func (j JSONMap) Set(s string) error {
	m := map[string]string{}
	if err := json.Unmarshal([]byte(s), &m); err != nil {
		return fmt.Errorf(`want a JSON object of strings, e.g. '{"cflinuxfs4":"/path"}': %w`, err)
	}
	*j.Values = m
	return nil
}

// Duration is a time.Duration written as a string ("10s") in config files and flags.
type Duration time.Duration

// UnmarshalJSON implements json.Unmarshaler.
func (d *Duration) UnmarshalJSON(b []byte) error {
	var s string
	if err := json.Unmarshal(b, &s); err != nil {
		return fmt.Errorf("duration must be a string like \"10s\": %w", err)
	}
	return d.Set(s)
}

// MarshalJSON implements json.Marshaler.
func (d Duration) MarshalJSON() ([]byte, error) { return json.Marshal(time.Duration(d).String()) }

// String implements flag.Value.
func (d Duration) String() string { return time.Duration(d).String() }

// Set implements flag.Value.
func (d *Duration) Set(s string) error {
	v, err := time.ParseDuration(s)
	if err != nil {
		return fmt.Errorf("duration %q: %w", s, err)
	}
	*d = Duration(v)
	return nil
}

// LoadJSON overlays the JSON config file at path on v (a pointer to a config struct).
func LoadJSON(path string, v any) error {
	b, err := os.ReadFile(path)
	if err != nil {
		return fmt.Errorf("read config: %w", err)
	}
	if err := json.Unmarshal(b, v); err != nil {
		return fmt.Errorf("parse config %s: %w", path, err)
	}
	return nil
}

// ParsePortRange parses an inclusive port range written "start-end", e.g. "61000-61999".
func ParsePortRange(s string) (start, end int, err error) {
	a, b, ok := strings.Cut(s, "-")
	if !ok {
		return 0, 0, fmt.Errorf("port range %q: want start-end, e.g. 61000-61999", s)
	}
	start, err1 := strconv.Atoi(strings.TrimSpace(a))
	end, err2 := strconv.Atoi(strings.TrimSpace(b))
	if err1 != nil || err2 != nil || start < 1 || end > 65535 || start > end {
		return 0, 0, fmt.Errorf("port range %q: want start-end with 1 <= start <= end <= 65535", s)
	}
	return start, end, nil
}
