package main

import (
	"errors"
	"maps"
	"testing"

	modelsv1 "github.com/gavel-sched/gavel/pkg/gen/gavel/models/v1"
	"github.com/gavel-sched/gavel/pkg/transform/plugin"
)

func TestProperties(t *testing.T) {
	env := func(kv ...string) []*modelsv1.EnvironmentVariable {
		var out []*modelsv1.EnvironmentVariable
		for i := 0; i < len(kv); i += 2 {
			out = append(out, &modelsv1.EnvironmentVariable{Name: kv[i], Value: kv[i+1]})
		}
		return out
	}
	tests := []struct {
		name   string
		n      networking
		props  map[string]string
		labels map[string]string
		env    []*modelsv1.EnvironmentVariable
		want   map[string]string
		extErr bool
	}{
		{"labels", networking{}, map[string]string{"x": "1"}, map[string]string{"app_guid": "a", "network_id": "n"}, nil,
			map[string]string{"x": "1", "app_guid": "a", "network_id": "n"}, false},
		{"env", networking{}, nil, nil, env("APP_GUID", "a", "NETWORK_ID", "n1", "NETWORK_ID", "n2"),
			map[string]string{"app_guid": "a", "network_id": "n2"}, false},
		{"label beats env", networking{}, nil, map[string]string{"app_guid": "from-label"}, env("APP_GUID", "from-env"),
			map[string]string{"app_guid": "from-label"}, false},
		{"prefix", networking{prefix: "network."}, nil, map[string]string{"app_guid": "a", "network_id": "n"}, nil,
			map[string]string{"network.app_guid": "a", "network.network_id": "n"}, false},
		{"no app guid passes", networking{}, map[string]string{"x": "1"}, nil, env("NETWORK_ID", "n"), map[string]string{"x": "1"}, false},
		{"no app guid refused", networking{requireAppGuid: true}, nil, nil, nil, nil, true},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			got, err := tt.n.properties(tt.props, tt.labels, tt.env)
			var pe *plugin.Error
			if tt.extErr != (errors.As(err, &pe) && pe.External) {
				t.Fatalf("error %v, want external: %v", err, tt.extErr)
			}
			if !tt.extErr && !maps.Equal(got, tt.want) {
				t.Errorf("got %v, want %v", got, tt.want)
			}
		})
	}
}
