package models

import (
	"strings"
	"testing"
)

func TestParseRootfs(t *testing.T) {
	tests := []struct {
		in, canonical string
		preloaded     string // the preloaded name, when it is one
		err           string // part of the error; empty when valid
	}{
		{in: "preloaded:cflinuxfs4", canonical: "preloaded:cflinuxfs4", preloaded: "cflinuxfs4"},
		{in: "preloaded://cflinuxfs4", canonical: "preloaded:cflinuxfs4", preloaded: "cflinuxfs4"},
		{in: "PRELOADED:x", canonical: "preloaded:x", preloaded: "x"},
		{in: "preloaded:///x/", canonical: "preloaded:x", preloaded: "x"},
		{in: "Preloaded://X/", canonical: "preloaded:X", preloaded: "X"},
		{in: "docker:///library/redis#7", canonical: "docker:///library/redis#7"},
		{in: "DOCKER:///library/redis/#7", canonical: "docker:///library/redis#7"},
		{in: "docker://registry.example.com/repo#tag", canonical: "docker://registry.example.com/repo#tag"},
		{in: "docker://Registry.Example.com:5000/team/app/", canonical: "docker://registry.example.com:5000/team/app"},
		{in: "oci://store/img?arch=amd64", canonical: "oci://store/img?arch=amd64"},
		{in: "Custom:thing", canonical: "custom:thing"},
		{in: "", err: "is required"},
		{in: "cflinuxfs4", err: "scheme"},
		{in: "preloaded:", err: "must name"},
		{in: "preloaded:///", err: "must name"},
		{in: "preloaded:a/b", err: "must not contain '/'"},
		{in: "preloaded:x#y", err: "without query or fragment"},
		{in: "preloaded:x y", err: "whitespace"},
		{in: "docker:library/redis", err: "docker:///REPO#TAG"},
		{in: "docker://", err: "must name"},
		{in: "docker://user:pw@host/repo", err: "user information"},
		{in: "docker://ho st/x", err: "whitespace"},
		{in: "1abc:x", err: "not a valid URI"},
	}
	for _, tt := range tests {
		t.Run(tt.in, func(t *testing.T) {
			r, err := ParseRootfs(tt.in)
			if tt.err != "" {
				if err == nil || !strings.Contains(err.Error(), tt.err) {
					t.Fatalf("ParseRootfs(%q) = %+v, %v; want error containing %q", tt.in, r, err, tt.err)
				}
				if ValidateRootfs("f", tt.in) == nil {
					t.Fatalf("ValidateRootfs(%q) accepted it", tt.in)
				}
				return
			}
			if err != nil {
				t.Fatalf("ParseRootfs(%q): %v", tt.in, err)
			}
			if r.String() != tt.canonical {
				t.Fatalf("canonical of %q = %q, want %q", tt.in, r.String(), tt.canonical)
			}
			if r.Preloaded() != (tt.preloaded != "") || r.Name != tt.preloaded {
				t.Fatalf("preloaded name of %q = %q (%v), want %q", tt.in, r.Name, r.Preloaded(), tt.preloaded)
			}
			// The canonical form is a fixed point.
			again, err := CanonicalRootfs(r.String())
			if err != nil || again != r.String() {
				t.Fatalf("canonical form %q re-parses as %q, %v", r.String(), again, err)
			}
		})
	}
}
