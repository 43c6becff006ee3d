package authz

import (
	"strings"
	"testing"
)

func TestRoleOf(t *testing.T) {
	cfg := Default()
	cfg.Roles["spiffe://gavel/rep/special"] = "read-only"
	tests := []struct {
		identity string
		want     string
		ok       bool
	}{
		{"spiffe://gavel/admin", "admin", true},
		{"spiffe://gavel/rep/cell-1", "rep/cell-1", true},
		{"spiffe://gavel/rep/special", "read-only", true}, // the longest match wins
		{"spiffe://gavel/rep/", "", false},                // * needs a suffix
		{"spiffe://gavel/route-emitter", "route-emitter", true},
		{"spiffe://gavel/stranger", "", false},
		{"spiffe://other/admin", "", false},
	}
	for _, tt := range tests {
		got, ok := cfg.RoleOf(tt.identity)
		if ok != tt.ok || (ok && got.String() != tt.want) {
			t.Errorf("RoleOf(%q) = %q, %v; want %q, %v", tt.identity, got, ok, tt.want, tt.ok)
		}
	}
}

func TestValidate(t *testing.T) {
	if err := Default().Validate(); err != nil {
		t.Fatalf("Default: %v", err)
	}
	tests := []struct {
		roles map[string]string
		want  string
	}{
		{map[string]string{"spiffe://gavel/x": "superuser"}, `unknown role "superuser"`},
		{map[string]string{"spiffe://gavel/x": "rep"}, "needs a cell"},
		{map[string]string{"spiffe://gavel/x": "admin/x"}, "takes no parameter"},
		{map[string]string{"spiffe://gavel/x": "rep/*"}, "uses * but the identity has none"},
		{map[string]string{"spiffe://*/x": "admin"}, "optionally ending in *"},
	}
	for _, tt := range tests {
		err := Config{Roles: tt.roles}.Validate()
		if err == nil || !strings.Contains(err.Error(), tt.want) {
			t.Errorf("Validate(%v) = %v, want %q", tt.roles, err, tt.want)
		}
	}
}

func TestMethods(t *testing.T) {
	p := Methods{Service: "s.S", Reads: []string{"Get"}, Grants: map[string][]string{Rep: {"Put"}}}
	tests := []struct {
		role   Role
		method string
		ok     bool
	}{
		{Role{Kind: ReadOnly}, "/s.S/Get", true},
		{Role{Kind: ReadOnly}, "/s.S/Put", false},
		{Role{Kind: Rep, Param: "c"}, "/s.S/Put", true},
		{Role{Kind: Rep, Param: "c"}, "/other.S/Get", false},
	}
	for _, tt := range tests {
		if err := p.Allow(tt.role, tt.method, nil); (err == nil) != tt.ok {
			t.Errorf("Allow(%s, %s) = %v, want ok=%v", tt.role, tt.method, err, tt.ok)
		}
	}
	if p.Mutating("/s.S/Get") || !p.Mutating("/s.S/Put") {
		t.Error("Mutating: reads are not mutating, everything else is")
	}
}

// TestSecretReaders: by default admin and rep hold the read-secrets capability and no other
// role does; the list is configurable and an unknown role in it is refused, naming it.
func TestSecretReaders(t *testing.T) {
	cfg := Default()
	for kind, want := range map[string]bool{Admin: true, Rep: true, ReadOnly: false, RouteEmitter: false,
		Auctioneer: false, Nsync: false, Router: false, BBS: false} {
		if got := cfg.MayReadSecrets(Role{Kind: kind, Param: "x"}); got != want {
			t.Errorf("MayReadSecrets(%s) = %v, want %v", kind, got, want)
		}
	}
	cfg.SecretReaders = []string{Admin}
	if cfg.MayReadSecrets(Role{Kind: Rep, Param: "cell-1"}) {
		t.Error("a rep reads secrets though secret_readers is [admin]")
	}
	cfg.SecretReaders = []string{"superuser"}
	if err := cfg.Validate(); err == nil || !strings.Contains(err.Error(), `secret_readers: unknown role "superuser"`) {
		t.Errorf("Validate = %v, want the unknown secret reader named", err)
	}
}
