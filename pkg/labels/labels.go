// Package labels implements Kubernetes-style label keys, values and
// selectors, used to constrain where work is placed.
//
// A selector is a comma-separated list of requirements, all of which must
// hold:
//
//	k=v, k==v      label k is present with value v
//	k!=v           label k is absent or has a value other than v
//	k in (a,b)     label k is present with value a or b
//	k notin (a,b)  label k is absent or has a value other than a and b
//	k              label k is present
//	!k             label k is absent
//
// Whitespace around tokens is ignored. The empty selector matches every
// label set.
package labels

import (
	"errors"
	"fmt"
	"regexp"
	"slices"
	"strings"
)

// Limits on keys and values.
const (
	// MaxNameLength is the longest key name or value.
	MaxNameLength = 63
	// MaxPrefixLength is the longest key prefix.
	MaxPrefixLength = 253
)

var (
	nameRE   = regexp.MustCompile(`^[A-Za-z0-9]([-A-Za-z0-9_.]*[A-Za-z0-9])?$`)
	prefixRE = regexp.MustCompile(`^[a-z0-9]([-a-z0-9]*[a-z0-9])?(\.[a-z0-9]([-a-z0-9]*[a-z0-9])?)*$`)
)

// IsDNSSubdomain reports whether s is a lower-case DNS subdomain (RFC 1123) of at most 253
// characters, e.g. "networking" or "net.example.com": label keys' prefixes and transformer
// plugin names.
func IsDNSSubdomain(s string) bool {
	return s != "" && len(s) <= MaxPrefixLength && prefixRE.MatchString(s)
}

// ValidateKey checks a label key of the form [prefix/]name: the name is 1-63
// characters of [A-Za-z0-9_.-] beginning and ending with an alphanumeric;
// the optional prefix is a DNS subdomain of at most 253 characters.
func ValidateKey(k string) error {
	prefix, name, hasPrefix := strings.Cut(k, "/")
	if !hasPrefix {
		name, prefix = prefix, ""
	}
	if hasPrefix {
		switch {
		case prefix == "":
			return fmt.Errorf("label key %q: empty prefix before '/'", k)
		case len(prefix) > MaxPrefixLength:
			return fmt.Errorf("label key %q: prefix longer than %d characters", k, MaxPrefixLength)
		case !prefixRE.MatchString(prefix):
			return fmt.Errorf("label key %q: prefix must be a lower-case DNS subdomain", k)
		}
	}
	if err := validateName(name); err != nil {
		return fmt.Errorf("label key %q: name %w", k, err)
	}
	return nil
}

// ValidateValue checks a label value: empty, or 1-63 characters of
// [A-Za-z0-9_.-] beginning and ending with an alphanumeric.
func ValidateValue(v string) error {
	if v == "" {
		return nil
	}
	if err := validateName(v); err != nil {
		return fmt.Errorf("label value %q: %w", v, err)
	}
	return nil
}

// validateName applies the rule shared by key names and values.
func validateName(s string) error {
	switch {
	case s == "":
		return errors.New("must not be empty")
	case len(s) > MaxNameLength:
		return fmt.Errorf("must be at most %d characters", MaxNameLength)
	case !nameRE.MatchString(s):
		return errors.New("must be alphanumerics, '-', '_' or '.', beginning and ending with an alphanumeric")
	}
	return nil
}

// operator is the relation a requirement tests.
type operator int

// The operators, in the order of the package documentation.
const (
	opEquals operator = iota + 1
	opNotEquals
	opIn
	opNotIn
	opExists
	opDoesNotExist
)

// requirement is one comma-separated term of a selector.
type requirement struct {
	key    string
	op     operator
	values []string // one value for = and !=; sorted, distinct values for in and notin; none otherwise
}

// matches reports whether labels satisfy r.
func (r requirement) matches(labels map[string]string) bool {
	v, ok := labels[r.key]
	switch r.op {
	case opEquals:
		return ok && v == r.values[0]
	case opNotEquals:
		return !ok || v != r.values[0]
	case opIn:
		return ok && slices.Contains(r.values, v)
	case opNotIn:
		return !ok || !slices.Contains(r.values, v)
	case opExists:
		return ok
	case opDoesNotExist:
		return !ok
	}
	return false
}

// String renders r in the form Parse accepts.
func (r requirement) String() string {
	switch r.op {
	case opEquals:
		return r.key + "=" + r.values[0]
	case opNotEquals:
		return r.key + "!=" + r.values[0]
	case opIn:
		return r.key + " in (" + strings.Join(r.values, ",") + ")"
	case opNotIn:
		return r.key + " notin (" + strings.Join(r.values, ",") + ")"
	case opDoesNotExist:
		return "!" + r.key
	default:
		return r.key
	}
}

// Selector is a parsed label selector. The zero value is the empty selector,
// which matches everything.
type Selector struct {
	reqs []requirement
}

// Matches reports whether labels satisfy every requirement of s.
func (s Selector) Matches(labels map[string]string) bool {
	for _, r := range s.reqs {
		if !r.matches(labels) {
			return false
		}
	}
	return true
}

// Empty reports whether s has no requirements and so matches everything.
func (s Selector) Empty() bool { return len(s.reqs) == 0 }

// String renders s in canonical form ("" for the empty selector); Parse of
// the result gives an equivalent selector.
func (s Selector) String() string {
	parts := make([]string, len(s.reqs))
	for i, r := range s.reqs {
		parts[i] = r.String()
	}
	return strings.Join(parts, ",")
}
