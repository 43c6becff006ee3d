package cni

import (
	"reflect"
	"strings"
	"testing"
)

func TestCNIArgs(t *testing.T) {
	ignore := [2]string{"IgnoreUnknown", "1"}
	long := strings.Repeat("x", MaxCNIArgs/2)
	for _, tc := range []struct {
		name        string
		props       map[string]string
		wantArgs    [][2]string
		wantSkipped []string
	}{
		{name: "none", wantArgs: [][2]string{ignore}},
		{
			name:     "sorted, values untouched",
			props:    map[string]string{"network_id": "n1", "app_guid": "g 1", "unicode": "日本 ☃", "empty": ""},
			wantArgs: [][2]string{ignore, {"app_guid", "g 1"}, {"empty", ""}, {"network_id", "n1"}, {"unicode", "日本 ☃"}},
		},
		{
			name:        "separators and NUL are skipped, not escaped",
			props:       map[string]string{"a": "x;y", "b": "x=y", "c;d": "v", "e=f": "v", "g": "nul\x00", "ok": "fine"},
			wantArgs:    [][2]string{ignore, {"ok", "fine"}},
			wantSkipped: []string{"a", "b", "c;d", "e=f", "g"},
		},
		{
			name:        "keys the reference plugins read are skipped",
			props:       map[string]string{"IP": "10.0.0.1", "MAC": "m", "GATEWAY": "g", "IgnoreUnknown": "0", "K8S_POD_NAME": "p", "ip": "lower is fine", "": "empty key"},
			wantArgs:    [][2]string{ignore, {"ip", "lower is fine"}},
			wantSkipped: []string{"", "GATEWAY", "IP", "IgnoreUnknown", "K8S_POD_NAME", "MAC"},
		},
		{
			name:        "what does not fit is skipped",
			props:       map[string]string{"a": long, "b": long, "c": "small"},
			wantArgs:    [][2]string{ignore, {"a", long}, {"c", "small"}},
			wantSkipped: []string{"b"},
		},
	} {
		t.Run(tc.name, func(t *testing.T) {
			args, skipped := CNIArgs(tc.props)
			if !reflect.DeepEqual(args, tc.wantArgs) {
				t.Errorf("args %q, want %q", args, tc.wantArgs)
			}
			if !reflect.DeepEqual(skipped, tc.wantSkipped) {
				t.Errorf("skipped %q, want %q", skipped, tc.wantSkipped)
			}
			size := -1
			for _, a := range args {
				size += len(a[0]) + 1 + len(a[1]) + 1
			}
			if size > MaxCNIArgs {
				t.Errorf("CNI_ARGS is %d bytes, over %d", size, MaxCNIArgs)
			}
		})
	}
}
