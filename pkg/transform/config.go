package transform

import (
	"encoding/json"
	"errors"
	"fmt"
	"slices"
	"strings"
	"time"

	"github.com/gavel-sched/gavel/pkg/config"
	"github.com/gavel-sched/gavel/pkg/labels"
	"github.com/gavel-sched/gavel/pkg/transform/plugin"
)

// Failure policies.
const (
	// PolicyFail fails the request when the plugin fails: nothing is stored.
	PolicyFail = "fail"
	// PolicyIgnore logs the failure and passes the plugin's input on unchanged.
	PolicyIgnore = "ignore"
)

// Defaults of a plugin's options.
const (
	// DefaultTimeout bounds one call of a plugin, waiting for a free slot included.
	DefaultTimeout = 2 * time.Second
	// DefaultMaxConcurrency bounds the calls in flight to one plugin.
	DefaultMaxConcurrency = 32
)

// PluginConfig is one transformer plugin of a chain.
type PluginConfig struct {
	// Name is the plugin's name, a lower-case DNS subdomain (e.g. "networking"); the plugin's
	// describe answer must give the same name.
	Name string `json:"name"`
	// Socket is the path of the plugin's UNIX socket.
	Socket string `json:"socket"`
	// Kinds are the kinds the plugin is called for ("desired_lrp", "task"); empty means every
	// kind its describe answer lists. Every configured kind must be described.
	Kinds []string `json:"kinds,omitempty"`
	// Timeout bounds one call, including the wait for a free slot (default 2s).
	Timeout config.Duration `json:"timeout,omitempty"`
	// FailurePolicy is "fail" (default: a failed plugin fails the request and refuses start-up
	// when it cannot be described) or "ignore" (the failure is logged and the plugin's input
	// is passed on unchanged).
	FailurePolicy string `json:"failure_policy,omitempty"`
	// CheckDeterminism calls the plugin twice per object and fails when the answers differ.
	CheckDeterminism bool `json:"check_determinism,omitempty"`
	// MaxConcurrency bounds the calls in flight to the plugin (default 32); it is also the
	// number of connections kept open to it.
	MaxConcurrency int `json:"max_concurrency,omitempty"`
}

// UnmarshalJSON decodes a plugin afresh: a config file loaded over a list the flags already
// filled must not merge its entries into theirs.
func (c *PluginConfig) UnmarshalJSON(b []byte) error {
	type plain PluginConfig
	var p plain
	if err := json.Unmarshal(b, &p); err != nil {
		return err
	}
	*c = PluginConfig(p)
	return nil
}

// WithDefaults returns c with zero options set to their defaults.
func (c PluginConfig) WithDefaults() PluginConfig {
	if c.Timeout == 0 {
		c.Timeout = config.Duration(DefaultTimeout)
	}
	if c.FailurePolicy == "" {
		c.FailurePolicy = PolicyFail
	}
	if c.MaxConcurrency == 0 {
		c.MaxConcurrency = DefaultMaxConcurrency
	}
	return c
}

// Validate reports every problem of the configuration (zero options are valid: they take
// defaults).
func (c PluginConfig) Validate() error {
	var errs []error
	if !labels.IsDNSSubdomain(c.Name) {
		errs = append(errs, fmt.Errorf("name %q must be a lower-case DNS subdomain (e.g. \"networking\" or \"net.example.com\")", c.Name))
	}
	if c.Socket == "" {
		errs = append(errs, errors.New("socket is required"))
	}
	for _, k := range c.Kinds {
		if !knownKind(k) {
			errs = append(errs, fmt.Errorf("kinds: unknown kind %q (want %q or %q)", k, plugin.KindDesiredLRP, plugin.KindTask))
		}
	}
	if c.Timeout < 0 {
		errs = append(errs, errors.New("timeout must not be negative"))
	}
	switch c.FailurePolicy {
	case "", PolicyFail, PolicyIgnore:
	default:
		errs = append(errs, fmt.Errorf("failure_policy %q must be %q or %q", c.FailurePolicy, PolicyFail, PolicyIgnore))
	}
	if c.MaxConcurrency < 0 {
		errs = append(errs, errors.New("max_concurrency must not be negative"))
	}
	if err := errors.Join(errs...); err != nil {
		return fmt.Errorf("transformer %q: %w", c.Name, err)
	}
	return nil
}

// ValidateChain validates every plugin and checks that names are unique.
func ValidateChain(plugins []PluginConfig) error {
	var errs []error
	seen := map[string]bool{}
	for i, p := range plugins {
		if err := p.Validate(); err != nil {
			errs = append(errs, fmt.Errorf("transformers[%d]: %w", i, err))
		}
		if seen[p.Name] {
			errs = append(errs, fmt.Errorf("transformers[%d]: name %q is used twice", i, p.Name))
		}
		seen[p.Name] = true
	}
	return errors.Join(errs...)
}

func knownKind(k string) bool { return k == plugin.KindDesiredLRP || k == plugin.KindTask }

// ParseFlag parses the flag form of a plugin, NAME=SOCKET[,option=value...], with options
// kinds=desired_lrp+task, timeout=2s, failure_policy=fail|ignore, check_determinism=true and
// max_concurrency=N, e.g. "networking=/run/net.sock,failure_policy=ignore".
func ParseFlag(s string) (PluginConfig, error) {
	parts := strings.Split(s, ",")
	name, socket, ok := strings.Cut(parts[0], "=")
	if !ok {
		return PluginConfig{}, fmt.Errorf("transformer %q: want NAME=SOCKET[,option=value...]", s)
	}
	c := PluginConfig{Name: name, Socket: socket}
	for _, opt := range parts[1:] {
		k, v, _ := strings.Cut(opt, "=")
		var err error
		switch k {
		case "kinds":
			c.Kinds = strings.Split(v, "+")
		case "timeout":
			err = c.Timeout.Set(v)
		case "failure_policy":
			c.FailurePolicy = v
		case "check_determinism":
			c.CheckDeterminism = v == "" || v == "true"
			if !slices.Contains([]string{"", "true", "false"}, v) {
				err = fmt.Errorf("check_determinism=%q: want true or false", v)
			}
		case "max_concurrency":
			_, err = fmt.Sscanf(v, "%d", &c.MaxConcurrency)
		default:
			err = fmt.Errorf("unknown option %q", k)
		}
		if err != nil {
			return PluginConfig{}, fmt.Errorf("transformer %q: %w", s, err)
		}
	}
	return c, c.Validate()
}

// Flag is a repeatable flag.Value adding one plugin per use (see ParseFlag). A plugin whose name
// is already listed (e.g. by the config file) is replaced in place, so flags override the file;
// others are appended in order. Several plugins may also be given in one value, separated by
// spaces (socket paths in flags cannot hold spaces; use the config file for those).
type Flag struct{ Plugins *[]PluginConfig }

// String implements flag.Value; its value can be given to Set again.
func (f Flag) String() string {
	if f.Plugins == nil {
		return ""
	}
	var out []string
	for _, p := range *f.Plugins {
		out = append(out, p.flagForm())
	}
	return strings.Join(out, " ")
}

// flagForm is c in ParseFlag's syntax.
func (c PluginConfig) flagForm() string {
	s := c.Name + "=" + c.Socket
	if len(c.Kinds) > 0 {
		s += ",kinds=" + strings.Join(c.Kinds, "+")
	}
	if c.Timeout != 0 {
		s += ",timeout=" + c.Timeout.String()
	}
	if c.FailurePolicy != "" {
		s += ",failure_policy=" + c.FailurePolicy
	}
	if c.CheckDeterminism {
		s += ",check_determinism=true"
	}
	if c.MaxConcurrency != 0 {
		s += fmt.Sprintf(",max_concurrency=%d", c.MaxConcurrency)
	}
	return s
}

// Set implements flag.Value.
func (f Flag) Set(s string) error {
	for _, spec := range strings.Fields(s) {
		c, err := ParseFlag(spec)
		if err != nil {
			return err
		}
		if i := slices.IndexFunc(*f.Plugins, func(p PluginConfig) bool { return p.Name == c.Name }); i >= 0 {
			(*f.Plugins)[i] = c
			continue
		}
		*f.Plugins = append(*f.Plugins, c)
	}
	return nil
}
