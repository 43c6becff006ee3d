package labels

import (
	"reflect"
	"strings"
	"testing"
)

func TestValidateKey(t *testing.T) {
	tests := []struct {
		key     string
		wantErr string
	}{
		{key: "zone"},
		{key: "a"},
		{key: "Stack_1.v-2"},
		{key: "gavel.io/zone"},
		{key: "a-b.c/d"},
		{key: strings.Repeat("a", 63)},
		{key: strings.Repeat("a", 253) + "/x"},
		{key: "", wantErr: "must not be empty"},
		{key: strings.Repeat("a", 64), wantErr: "at most 63"},
		{key: "-zone", wantErr: "beginning and ending"},
		{key: "zone.", wantErr: "beginning and ending"},
		{key: "zo ne", wantErr: "beginning and ending"},
		{key: "/zone", wantErr: "empty prefix"},
		{key: "gavel.io/", wantErr: "must not be empty"},
		{key: "Gavel.io/zone", wantErr: "DNS subdomain"},
		{key: "gavel..io/zone", wantErr: "DNS subdomain"},
		{key: "a/b/c", wantErr: "name must be"},
		{key: strings.Repeat("a", 254) + "/x", wantErr: "prefix longer"},
	}
	for _, tt := range tests {
		t.Run(tt.key, func(t *testing.T) {
			checkErr(t, ValidateKey(tt.key), tt.wantErr)
		})
	}
}

func TestValidateValue(t *testing.T) {
	tests := []struct {
		value   string
		wantErr string
	}{
		{value: ""},
		{value: "us-east-1a"},
		{value: "V1.2_3"},
		{value: strings.Repeat("v", 63)},
		{value: strings.Repeat("v", 64), wantErr: "at most 63"},
		{value: "a/b", wantErr: "alphanumerics"},
		{value: "_a", wantErr: "beginning and ending"},
	}
	for _, tt := range tests {
		t.Run(tt.value, func(t *testing.T) {
			checkErr(t, ValidateValue(tt.value), tt.wantErr)
		})
	}
}

func TestParse(t *testing.T) {
	tests := []struct {
		in      string
		want    string // canonical String()
		wantErr string
	}{
		{in: "", want: ""},
		{in: "   ", want: ""},
		{in: "zone=a", want: "zone=a"},
		{in: "zone==a", want: "zone=a"},
		{in: " zone = a ", want: "zone=a"},
		{in: "zone=", want: "zone="},
		{in: "zone!=a", want: "zone!=a"},
		{in: "zone != ", want: "zone!="},
		{in: "zone in (b, a, b)", want: "zone in (a,b)"},
		{in: "zone in(a)", want: "zone in (a)"},
		{in: "zone notin (a,b)", want: "zone notin (a,b)"},
		{in: "gpu", want: "gpu"},
		{in: "!gpu", want: "!gpu"},
		{in: " ! gpu ", want: "!gpu"},
		{in: "in in (in, notin)", want: "in in (in,notin)"},
		{in: "gavel.io/zone=a,gpu,!spot,tier in (1,2)", want: "gavel.io/zone=a,gpu,!spot,tier in (1,2)"},
		{in: "a=1,a!=2", want: "a=1,a!=2"},
		{in: ",", wantErr: `column 1: expected a label key, found ","`},
		{in: "a=b,", wantErr: "column 5: expected a label key, found end of input"},
		{in: "a=b c", wantErr: `column 5: expected ',' or end of input after requirement, found "c"`},
		{in: "a b", wantErr: `column 3: expected one of =, ==, !=, in, notin`},
		{in: "a=(b)", wantErr: `column 3: expected a value after "=", found "("`},
		{in: "a===b", wantErr: `column 4: expected a value after "==", found "="`},
		{in: "a in b", wantErr: `column 6: expected '(' after "in"`},
		{in: "a in ()", wantErr: `column 7: expected a value in the "in" set, found ")"`},
		{in: "a in (b,)", wantErr: `column 9: expected a value in the "in" set`},
		{in: "a in (b", wantErr: `column 8: expected ',' or ')' in the "in" set, found end of input`},
		{in: "a notin (b c)", wantErr: `column 12: expected ',' or ')' in the "notin" set, found "c"`},
		{in: "!a=b", wantErr: `column 3: expected ',' or end of input after requirement, found "="`},
		{in: "!", wantErr: "column 2: expected a label key, found end of input"},
		{in: "-a=b", wantErr: `column 1: label key "-a"`},
		{in: "a=-b", wantErr: `column 3: label value "-b"`},
		{in: "a in (ok, b/c)", wantErr: `column 11: label value "b/c"`},
		{in: "a=b)", wantErr: `column 4: expected ',' or end of input after requirement, found ")"`},
	}
	for _, tt := range tests {
		t.Run(tt.in, func(t *testing.T) {
			sel, err := Parse(tt.in)
			checkErr(t, err, tt.wantErr)
			if err != nil {
				return
			}
			if got := sel.String(); got != tt.want {
				t.Errorf("String() = %q, want %q", got, tt.want)
			}
			if got, want := sel.Empty(), tt.want == ""; got != want {
				t.Errorf("Empty() = %v, want %v", got, want)
			}
		})
	}
}

func TestMatches(t *testing.T) {
	labels := map[string]string{"zone": "a", "gpu": "", "gavel.io/tier": "2"}
	tests := []struct {
		sel  string
		want bool
	}{
		{sel: "", want: true},
		{sel: "zone=a", want: true},
		{sel: "zone==b", want: false},
		{sel: "missing=a", want: false},
		{sel: "gpu=", want: true},
		{sel: "zone!=b", want: true},
		{sel: "zone!=a", want: false},
		{sel: "missing!=a", want: true},
		{sel: "zone in (a,b)", want: true},
		{sel: "zone in (b,c)", want: false},
		{sel: "missing in (a)", want: false},
		{sel: "zone notin (a,b)", want: false},
		{sel: "zone notin (b)", want: true},
		{sel: "missing notin (a)", want: true},
		{sel: "gpu", want: true},
		{sel: "missing", want: false},
		{sel: "!missing", want: true},
		{sel: "!gpu", want: false},
		{sel: "zone=a,gpu,gavel.io/tier in (1,2)", want: true},
		{sel: "zone=a,gpu,gavel.io/tier in (1,3)", want: false},
	}
	for _, tt := range tests {
		t.Run(tt.sel, func(t *testing.T) {
			sel, err := Parse(tt.sel)
			if err != nil {
				t.Fatal(err)
			}
			if got := sel.Matches(labels); got != tt.want {
				t.Errorf("Matches(%v) = %v, want %v", labels, got, tt.want)
			}
		})
	}
	var zero Selector
	if !zero.Matches(nil) || !zero.Empty() || zero.String() != "" {
		t.Error("zero Selector should be empty and match everything")
	}
}

func FuzzParse(f *testing.F) {
	for _, seed := range []string{
		"", " ", "a=b", "a==b", "a!=b", "a in (b,c)", "a notin (b)", "a", "!a",
		"gavel.io/zone=us-east-1a,gpu,!spot", "a in (c, b, c)", "a=", "a!=,b", ",", "a in ()",
		"in in (in)", "!a=b", "a b", "a=b)", "((", "!!a", "a=\u00e9",
	} {
		f.Add(seed)
	}
	f.Fuzz(func(t *testing.T, s string) {
		sel, err := Parse(s)
		if err != nil {
			if !strings.HasPrefix(err.Error(), "parse selector ") {
				t.Fatalf("error without context: %v", err)
			}
			return
		}
		out := sel.String()
		again, err := Parse(out)
		if err != nil {
			t.Fatalf("Parse(%q).String() = %q, which does not parse: %v", s, out, err)
		}
		if !reflect.DeepEqual(sel, again) {
			t.Fatalf("Parse(%q) = %#v; re-parsed from %q = %#v", s, sel, out, again)
		}
		if again.String() != out {
			t.Fatalf("String() not stable: %q then %q", out, again.String())
		}
		sel.Matches(map[string]string{"a": "b", "in": ""})
	})
}

// checkErr fails unless err is nil when wantErr is empty, or contains wantErr.
func checkErr(t *testing.T, err error, wantErr string) {
	t.Helper()
	if wantErr == "" {
		if err != nil {
			t.Fatalf("unexpected error: %v", err)
		}
		return
	}
	if err == nil || !strings.Contains(err.Error(), wantErr) {
		t.Fatalf("error = %v, want one containing %q", err, wantErr)
	}
}
