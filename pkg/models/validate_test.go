package models

import (
	"errors"
	"slices"
	"strings"
	"testing"

	"google.golang.org/protobuf/proto"

	modelsv1 "github.com/gavel-sched/gavel/pkg/gen/gavel/models/v1"
	"github.com/gavel-sched/gavel/pkg/rpcerr"
)

// violationFields returns the field of every violation of err, failing when err is not nil and
// not an *rpcerr.InvalidError.
func violationFields(t *testing.T, err error) []string {
	t.Helper()
	if err == nil {
		return nil
	}
	var inv *rpcerr.InvalidError
	if !errors.As(err, &inv) {
		t.Fatalf("error %v (%T) is not an *rpcerr.InvalidError", err, err)
	}
	if !errors.Is(err, rpcerr.ErrInvalid) {
		t.Fatalf("errors.Is(%v, ErrInvalid) is false", err)
	}
	out := make([]string, len(inv.Violations))
	for i, v := range inv.Violations {
		if v.Reason == "" {
			t.Errorf("violation of %s has no reason", v.Field)
		}
		out[i] = v.Field
	}
	return out
}

func assertFields(t *testing.T, err error, want []string) {
	t.Helper()
	got := violationFields(t, err)
	if !slices.Equal(got, want) {
		t.Errorf("violations = %q, want %q (error: %v)", got, want, err)
	}
}

func runAction(path string) *modelsv1.Action {
	return &modelsv1.Action{Kind: &modelsv1.Action_Run{Run: &modelsv1.RunAction{Path: path}}}
}

func serial(children ...*modelsv1.Action) *modelsv1.Action {
	return &modelsv1.Action{Kind: &modelsv1.Action_Serial{Serial: &modelsv1.SerialAction{Actions: children}}}
}

func validLRP() *modelsv1.DesiredLRP {
	return &modelsv1.DesiredLRP{
		ProcessGuid: "web-1_a",
		Domain:      "cf-apps.v1",
		Rootfs:      "preloaded:cflinuxfs4",
		Instances:   3,
		MemoryMb:    256,
		DiskMb:      1024,
		MaxPids:     100,
		PlacementConstraint: &modelsv1.PlacementConstraint{
			Require:  []string{"staging", "Skynet"},
			Disallow: []string{"gpu"},
		},
		Properties: map[string]string{"org.cloudfoundry/space": "dev"},
		Labels:     map[string]string{"app": "web", "tier": ""},
		Annotation: "hello",
		Routes: map[string][]byte{
			"cf-router": []byte(`[{"port":8080,"routes":["foo.example.com"]}]`),
			"skydns":    []byte(`{}`),
		},
		Ports: []uint32{8080, 2222},
		Env:   []*modelsv1.EnvironmentVariable{{Name: "PORT", Value: "8080"}},
		Setup: &modelsv1.Action{Kind: &modelsv1.Action_Download{Download: &modelsv1.DownloadAction{
			From: "http://blobs/droplet.tgz", To: "/app", ChecksumAlgorithm: "sha256", ChecksumValue: "ab12",
		}}},
		Action: &modelsv1.Action{Kind: &modelsv1.Action_Codependent{Codependent: &modelsv1.CodependentAction{
			Actions: []*modelsv1.Action{runAction("/app/start"), runAction("/bin/sshd")},
		}}},
		Monitor: &modelsv1.Action{Kind: &modelsv1.Action_Timeout{Timeout: &modelsv1.TimeoutAction{
			Action: runAction("/bin/healthcheck"), TimeoutMs: 1000,
		}}},
		CheckDefinition: &modelsv1.CheckDefinition{
			Checks: []*modelsv1.Check{{Kind: &modelsv1.Check_Tcp{Tcp: &modelsv1.TCPCheck{Port: 8080}}}},
			ReadinessChecks: []*modelsv1.Check{{Kind: &modelsv1.Check_Http{Http: &modelsv1.HTTPCheck{
				Port: 8080, Path: "/ready", RequestTimeoutMs: 100, IntervalMs: 1000,
			}}}},
		},
		StartTimeoutMs: 60000,
		Links: &modelsv1.Links{
			Provides: []*modelsv1.LinkProvide{{Name: "db", Type: "postgres", Port: 5432}},
			Consumes: []*modelsv1.LinkConsume{
				{Name: "cache", Type: "redis", Network: "instance"},
				{Name: "logs", From: "other.syslog", Network: "host"},
				{Name: "ext", Custom: &modelsv1.ResolvedLink{}},
			},
		},
		LogGuid:   "log",
		CpuWeight: 50,
		LogDrains: []string{"syslog://logs.example.com:514", "syslog-tls://10.0.0.5:6514"},
	}
}

func TestValidateDesiredLRP(t *testing.T) {
	tests := []struct {
		name   string
		mutate func(d *modelsv1.DesiredLRP)
		limits Limits
		want   []string
	}{
		{name: "valid", mutate: func(d *modelsv1.DesiredLRP) {}},
		{name: "minimal", mutate: func(d *modelsv1.DesiredLRP) {
			*d = modelsv1.DesiredLRP{ProcessGuid: "g", Domain: "d", Rootfs: "docker:///library/redis#7", Action: runAction("/x")}
		}},
		{name: "zero limits mean defaults", limits: Limits{}, mutate: func(d *modelsv1.DesiredLRP) { d.Instances = 1000 }},
		{name: "empty", mutate: func(d *modelsv1.DesiredLRP) { *d = modelsv1.DesiredLRP{} },
			want: []string{"desired_lrp.process_guid", "desired_lrp.domain", "desired_lrp.rootfs", "desired_lrp.action"}},
		{name: "bad guid and domain", mutate: func(d *modelsv1.DesiredLRP) {
			d.ProcessGuid = "a/b"
			d.Domain = "cf apps"
		}, want: []string{"desired_lrp.process_guid", "desired_lrp.domain"}},
		{name: "guid with dot", mutate: func(d *modelsv1.DesiredLRP) { d.ProcessGuid = "a.b" },
			want: []string{"desired_lrp.process_guid"}},
		{name: "guid too long", mutate: func(d *modelsv1.DesiredLRP) { d.ProcessGuid = strings.Repeat("a", 129) },
			want: []string{"desired_lrp.process_guid"}},
		{name: "guid of 128", mutate: func(d *modelsv1.DesiredLRP) { d.ProcessGuid = strings.Repeat("a", 128) }},
		{name: "bad rootfs", mutate: func(d *modelsv1.DesiredLRP) { d.Rootfs = "cflinuxfs4" },
			want: []string{"desired_lrp.rootfs"}},
		{name: "instances", limits: Limits{MaxInstances: 5}, mutate: func(d *modelsv1.DesiredLRP) { d.Instances = 6 },
			want: []string{"desired_lrp.instances"}},
		{name: "negative resources", mutate: func(d *modelsv1.DesiredLRP) {
			d.Instances = -1
			d.MemoryMb = -1
			d.DiskMb = -1
			d.MaxPids = -1
			d.StartTimeoutMs = -1
			d.CpuWeight = 101
		}, want: []string{"desired_lrp.instances", "desired_lrp.memory_mb", "desired_lrp.disk_mb", "desired_lrp.max_pids",
			"desired_lrp.start_timeout_ms", "desired_lrp.cpu_weight"}},
		{name: "log drains", mutate: func(d *modelsv1.DesiredLRP) {
			d.LogDrains = []string{"https://logs.example.com:443", "syslog://nohost", "syslog-tls://h:6514/path", "syslog://h:514", "::"}
		}, want: []string{"desired_lrp.log_drains[0]", "desired_lrp.log_drains[1]", "desired_lrp.log_drains[2]", "desired_lrp.log_drains[4]"}},
		{name: "too many log drains", mutate: func(d *modelsv1.DesiredLRP) {
			d.LogDrains = slices.Repeat([]string{"syslog://h:514"}, MaxLogDrains+1)
		}, want: []string{"desired_lrp.log_drains"}},
		{name: "placement tags", mutate: func(d *modelsv1.DesiredLRP) {
			d.PlacementConstraint = &modelsv1.PlacementConstraint{
				Require:  []string{"ok", "", "a,b", strings.Repeat("t", 64), strings.Repeat("t", 63)},
				Disallow: []string{"x y", "tab\t"},
			}
		}, want: []string{"desired_lrp.placement_constraint.require[1]", "desired_lrp.placement_constraint.require[2]",
			"desired_lrp.placement_constraint.require[3]", "desired_lrp.placement_constraint.disallow[0]",
			"desired_lrp.placement_constraint.disallow[1]"}},
		{name: "properties", limits: Limits{MaxPropertyBytes: 10}, mutate: func(d *modelsv1.DesiredLRP) {
			d.Properties = map[string]string{"": "v", "key": "0123456"}
		}, want: []string{`desired_lrp.properties[""]`, "desired_lrp.properties"}},
		{name: "labels", mutate: func(d *modelsv1.DesiredLRP) {
			d.Labels = map[string]string{"ok": "fine", "bad key": "v", "k": "bad value!"}
		}, want: []string{`desired_lrp.labels["bad key"]`, `desired_lrp.labels["k"]`}},
		{name: "annotation", limits: Limits{MaxAnnotationBytes: 4}, mutate: func(d *modelsv1.DesiredLRP) { d.Annotation = "12345" },
			want: []string{"desired_lrp.annotation"}},
		{name: "routes", mutate: func(d *modelsv1.DesiredLRP) {
			d.Routes = map[string][]byte{"cf-router": []byte(`[{`), "": []byte(`{}`), "empty": nil}
		}, want: []string{`desired_lrp.routes[""]`, `desired_lrp.routes["cf-router"]`, `desired_lrp.routes["empty"]`}},
		{name: "routes size", limits: Limits{MaxRouteBytes: 8}, mutate: func(d *modelsv1.DesiredLRP) {
			d.Routes = map[string][]byte{"a": []byte(`[1,2]`), "b": []byte(`[3,4]`)}
		}, want: []string{"desired_lrp.routes"}},
		{name: "ports", mutate: func(d *modelsv1.DesiredLRP) { d.Ports = []uint32{8080, 0, 70000, 8080} },
			want: []string{"desired_lrp.ports[1]", "desired_lrp.ports[2]", "desired_lrp.ports[3]"}},
		{name: "too many ports", mutate: func(d *modelsv1.DesiredLRP) {
			d.Ports = nil
			for p := uint32(1); p <= 21; p++ {
				d.Ports = append(d.Ports, p)
			}
		}, want: []string{"desired_lrp.ports"}},
		{name: "env", mutate: func(d *modelsv1.DesiredLRP) {
			d.Env = []*modelsv1.EnvironmentVariable{{Name: "A"}, {Name: ""}, {Name: "B=C"}}
		}, want: []string{"desired_lrp.env[1].name", "desired_lrp.env[2].name"}},
		{name: "actions", mutate: func(d *modelsv1.DesiredLRP) {
			d.Setup = &modelsv1.Action{}
			d.Action = serial(
				runAction("/ok"),
				runAction(""),
				&modelsv1.Action{Kind: &modelsv1.Action_Parallel{Parallel: &modelsv1.ParallelAction{}}},
				&modelsv1.Action{Kind: &modelsv1.Action_Try{Try: &modelsv1.TryAction{}}},
				&modelsv1.Action{Kind: &modelsv1.Action_Timeout{Timeout: &modelsv1.TimeoutAction{Action: runAction("/x")}}},
				&modelsv1.Action{Kind: &modelsv1.Action_Download{Download: &modelsv1.DownloadAction{ChecksumValue: "ab"}}},
				&modelsv1.Action{Kind: &modelsv1.Action_Download{Download: &modelsv1.DownloadAction{From: "f", To: "t", ChecksumAlgorithm: "md5", ChecksumValue: "ab"}}},
				&modelsv1.Action{Kind: &modelsv1.Action_Download{Download: &modelsv1.DownloadAction{From: "f", To: "t", ChecksumAlgorithm: "sha1"}}},
				&modelsv1.Action{Kind: &modelsv1.Action_Run{Run: &modelsv1.RunAction{Path: "/x", Env: []*modelsv1.EnvironmentVariable{{Name: "="}}}}},
				nil,
			)
			d.Monitor = &modelsv1.Action{Kind: &modelsv1.Action_Codependent{Codependent: &modelsv1.CodependentAction{}}}
		}, want: []string{
			"desired_lrp.setup",
			"desired_lrp.action.serial.actions[1].run.path",
			"desired_lrp.action.serial.actions[2].parallel.actions",
			"desired_lrp.action.serial.actions[3].try.action",
			"desired_lrp.action.serial.actions[4].timeout.timeout_ms",
			"desired_lrp.action.serial.actions[5].download.from",
			"desired_lrp.action.serial.actions[5].download.to",
			"desired_lrp.action.serial.actions[5].download.checksum_algorithm",
			"desired_lrp.action.serial.actions[6].download.checksum_algorithm",
			"desired_lrp.action.serial.actions[7].download.checksum_value",
			"desired_lrp.action.serial.actions[8].run.env[0].name",
			"desired_lrp.action.serial.actions[9]",
			"desired_lrp.monitor.codependent.actions",
		}},
		{name: "checks", mutate: func(d *modelsv1.DesiredLRP) {
			d.CheckDefinition = &modelsv1.CheckDefinition{
				Checks: []*modelsv1.Check{
					{},
					{Kind: &modelsv1.Check_Tcp{Tcp: &modelsv1.TCPCheck{Port: 0, ConnectTimeoutMs: -1, IntervalMs: -1}}},
				},
				ReadinessChecks: []*modelsv1.Check{
					{Kind: &modelsv1.Check_Http{Http: &modelsv1.HTTPCheck{Port: 65536, Path: "ready", RequestTimeoutMs: -1, IntervalMs: -1}}},
				},
			}
		}, want: []string{
			"desired_lrp.check_definition.checks[0]",
			"desired_lrp.check_definition.checks[1].tcp.port",
			"desired_lrp.check_definition.checks[1].tcp.connect_timeout_ms",
			"desired_lrp.check_definition.checks[1].tcp.interval_ms",
			"desired_lrp.check_definition.readiness_checks[0].http.port",
			"desired_lrp.check_definition.readiness_checks[0].http.path",
			"desired_lrp.check_definition.readiness_checks[0].http.request_timeout_ms",
			"desired_lrp.check_definition.readiness_checks[0].http.interval_ms",
		}},
		{name: "links", mutate: func(d *modelsv1.DesiredLRP) {
			d.Links = &modelsv1.Links{
				Provides: []*modelsv1.LinkProvide{
					{Name: "a", Type: "t"},
					{Name: "", Type: ""},
					{Name: "a", Type: "t", Port: 70000},
				},
				Consumes: []*modelsv1.LinkConsume{
					{Name: "c", Type: "t"},
					{Name: "c", Type: "t", Network: "public"},
					{Name: "d"},
				},
			}
		}, want: []string{
			"desired_lrp.links.provides[1].name",
			"desired_lrp.links.provides[1].type",
			"desired_lrp.links.provides[2].name",
			"desired_lrp.links.provides[2].port",
			"desired_lrp.links.consumes[1].name",
			"desired_lrp.links.consumes[1].network",
			"desired_lrp.links.consumes[2]",
		}},
		{name: "deep action", mutate: func(d *modelsv1.DesiredLRP) { d.Action = nest(MaxActionDepth + 1) },
			want: []string{"desired_lrp.action" + strings.Repeat(".try.action", MaxActionDepth)}},
		{name: "deepest allowed action", mutate: func(d *modelsv1.DesiredLRP) { d.Action = nest(MaxActionDepth) }},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			d := validLRP()
			tt.mutate(d)
			assertFields(t, ValidateDesiredLRP("desired_lrp", d, tt.limits), tt.want)
		})
	}
}

// nest builds an action tree of depth levels: try actions around a run action.
func nest(depth int) *modelsv1.Action {
	a := runAction("/x")
	for i := 1; i < depth; i++ {
		a = &modelsv1.Action{Kind: &modelsv1.Action_Try{Try: &modelsv1.TryAction{Action: a}}}
	}
	return a
}

func TestValidateDesiredLRPNil(t *testing.T) {
	assertFields(t, ValidateDesiredLRP("desired_lrp", nil, DefaultLimits()), []string{"desired_lrp"})
	assertFields(t, ValidateDesiredLRP("", &modelsv1.DesiredLRP{ProcessGuid: "g", Domain: "d", Rootfs: "x:y"}, DefaultLimits()),
		[]string{"action"})
}

func TestValidateRootfs(t *testing.T) {
	tests := []struct {
		rootfs string
		ok     bool
	}{
		{"preloaded:cflinuxfs4", true},
		{"preloaded://cflinuxfs4", true},
		{"docker:///library/redis#7", true},
		{"docker://registry.local:5000/app#v1", true},
		{"docker:///library/redis", true},
		{"", false},
		{"cflinuxfs4", false},
		{":x", false},
		{"preloaded:", false},
		{"docker://", false},
		{"docker:///", false},
		{"docker://#7", false},
		{"docker:///library/redis #7", false},
		{"/abs/path", false},
	}
	for _, tt := range tests {
		t.Run(tt.rootfs, func(t *testing.T) {
			err := ValidateRootfs("rootfs", tt.rootfs)
			if tt.ok {
				assertFields(t, err, nil)
			} else {
				assertFields(t, err, []string{"rootfs"})
			}
		})
	}
}

func TestValidateNames(t *testing.T) {
	tests := []struct {
		name     string
		validate func(field, s string) error
		value    string
		ok       bool
	}{
		{"guid", ValidateGuid, "abc-DEF_123", true},
		{"guid empty", ValidateGuid, "", false},
		{"guid dot", ValidateGuid, "a.b", false},
		{"guid unicode", ValidateGuid, "gé", false},
		{"guid 129", ValidateGuid, strings.Repeat("g", 129), false},
		{"domain", ValidateDomain, "cf-apps.v1_x", true},
		{"domain empty", ValidateDomain, "", false},
		{"domain slash", ValidateDomain, "a/b", false},
		{"domain 128", ValidateDomain, strings.Repeat("d", 128), true},
		{"cell", ValidateCellID, "cell-z1.0", true},
		{"cell colon", ValidateCellID, "cell:1", false},
		{"tag", ValidatePlacementTag, "staging", true},
		{"tag unicode 63", ValidatePlacementTag, strings.Repeat("é", 63), true},
		{"tag 64", ValidatePlacementTag, strings.Repeat("t", 64), false},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			err := tt.validate("f", tt.value)
			if tt.ok {
				assertFields(t, err, nil)
			} else {
				assertFields(t, err, []string{"f"})
			}
		})
	}
}

func TestValidateInstanceKey(t *testing.T) {
	tests := []struct {
		name string
		key  *modelsv1.ActualLRPInstanceKey
		want []string
	}{
		{"valid", &modelsv1.ActualLRPInstanceKey{InstanceGuid: "ig-1", CellId: "cell.1"}, nil},
		{"nil", nil, []string{"instance_key"}},
		{"empty", &modelsv1.ActualLRPInstanceKey{}, []string{"instance_key.instance_guid", "instance_key.cell_id"}},
		{"charset", &modelsv1.ActualLRPInstanceKey{InstanceGuid: "a b", CellId: "c/1"}, []string{"instance_key.instance_guid", "instance_key.cell_id"}},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			assertFields(t, ValidateInstanceKey("instance_key", tt.key), tt.want)
		})
	}
}

func TestValidateNetInfo(t *testing.T) {
	tests := []struct {
		name string
		info *modelsv1.ActualLRPNetInfo
		want []string
	}{
		{"valid", &modelsv1.ActualLRPNetInfo{Address: "10.0.0.1", Ports: []*modelsv1.PortMapping{{ContainerPort: 8080, HostPort: 61000}}}, nil},
		{"no ports", &modelsv1.ActualLRPNetInfo{}, nil},
		{"nil", nil, []string{"net_info"}},
		{"bad ports", &modelsv1.ActualLRPNetInfo{Ports: []*modelsv1.PortMapping{
			{ContainerPort: 8080, HostPort: 61000}, {ContainerPort: 0, HostPort: 65536},
		}}, []string{"net_info.ports[1].container_port", "net_info.ports[1].host_port"}},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			assertFields(t, ValidateNetInfo("net_info", tt.info), tt.want)
		})
	}
}

func TestValidatePlacementError(t *testing.T) {
	tests := []struct {
		name string
		pe   *modelsv1.PlacementError
		want []string
	}{
		{"valid", &modelsv1.PlacementError{Code: modelsv1.PlacementError_CODE_CELL_MISMATCH, Message: "found no compatible cell"}, nil},
		{"nil", nil, []string{"placement_error"}},
		{"empty", &modelsv1.PlacementError{}, []string{"placement_error.code", "placement_error.message"}},
		{"unknown code", &modelsv1.PlacementError{Code: 99, Message: "m"}, []string{"placement_error.code"}},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			assertFields(t, ValidatePlacementError("placement_error", tt.pe), tt.want)
		})
	}
}

func TestValidateSmallHelpers(t *testing.T) {
	tests := []struct {
		name string
		err  error
		want []string
	}{
		{"constraint nil", ValidatePlacementConstraint("pc", nil), nil},
		{"constraint", ValidatePlacementConstraint("pc", &modelsv1.PlacementConstraint{Disallow: []string{"a", ""}}), []string{"pc.disallow[1]"}},
		{"labels", ValidateLabels("labels", map[string]string{"a": "b", "example.com/x": "y"}), nil},
		{"labels bad", ValidateLabels("labels", map[string]string{"": "b", "-a": "c"}), []string{`labels[""]`, `labels["-a"]`}},
		{"routes", ValidateRoutes("routes", map[string][]byte{"cf-router": []byte(`[]`)}, Limits{}), nil},
		{"routes bad", ValidateRoutes("routes", map[string][]byte{"x": []byte(`nope`)}, Limits{}), []string{`routes["x"]`}},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			assertFields(t, tt.err, tt.want)
		})
	}
}

func TestValidateCellPresence(t *testing.T) {
	valid := func() *modelsv1.CellPresence {
		return &modelsv1.CellPresence{
			CellId:            "cell-1",
			RepAddress:        "10.0.0.1:1800",
			Zone:              "z1",
			Capacity:          &modelsv1.CellCapacity{MemoryMb: 1024, DiskMb: 2048, Containers: 100},
			PlacementTags:     []string{"staging"},
			PreloadedRootfses: map[string]string{"cflinuxfs4": "/var/rootfs/cflinuxfs4"},
			RootfsProviders:   []string{"docker", "oci+tar"},
		}
	}
	tests := []struct {
		name   string
		mutate func(c *modelsv1.CellPresence)
		want   []string
	}{
		{"valid", func(c *modelsv1.CellPresence) {}, nil},
		{"ipv6", func(c *modelsv1.CellPresence) { c.RepAddress = "[::1]:1800" }, nil},
		{"empty", func(c *modelsv1.CellPresence) { *c = modelsv1.CellPresence{} },
			[]string{"cell.cell_id", "cell.rep_address", "cell.capacity"}},
		{"bad", func(c *modelsv1.CellPresence) {
			c.CellId = "cell 1"
			c.RepAddress = "host"
			c.Capacity = &modelsv1.CellCapacity{MemoryMb: -1, DiskMb: -1, Containers: -1}
			c.PlacementTags = []string{"ok", "a,b"}
			c.PreloadedRootfses = map[string]string{"": "/p", "x": ""}
			c.RootfsProviders = []string{"docker", "1x", ""}
		}, []string{
			"cell.cell_id", "cell.rep_address", "cell.capacity.memory_mb", "cell.capacity.disk_mb", "cell.capacity.containers",
			"cell.placement_tags[1]", `cell.preloaded_rootfses[""]`, `cell.preloaded_rootfses["x"]`,
			"cell.rootfs_providers[1]", "cell.rootfs_providers[2]",
		}},
		{"port zero", func(c *modelsv1.CellPresence) { c.RepAddress = "h:0" }, []string{"cell.rep_address"}},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			c := valid()
			tt.mutate(c)
			assertFields(t, ValidateCellPresence("cell", c), tt.want)
		})
	}
	assertFields(t, ValidateCellPresence("cell", nil), []string{"cell"})
}

func validTask() *modelsv1.TaskDefinition {
	return &modelsv1.TaskDefinition{
		Rootfs:                "docker:///library/alpine",
		Action:                runAction("/bin/true"),
		MemoryMb:              64,
		DiskMb:                64,
		PlacementConstraint:   &modelsv1.PlacementConstraint{Require: []string{"staging"}},
		Properties:            map[string]string{"k": "v"},
		Labels:                map[string]string{"kind": "staging"},
		ResultFile:            "/tmp/result",
		CompletionCallbackUrl: "https://cc.internal:9023/tasks/done",
		Env:                   []*modelsv1.EnvironmentVariable{{Name: "A", Value: "1"}},
		MaxRejections:         3,
	}
}

func TestValidateTaskDefinition(t *testing.T) {
	tests := []struct {
		name   string
		mutate func(d *modelsv1.TaskDefinition)
		limits Limits
		want   []string
	}{
		{name: "valid", mutate: func(d *modelsv1.TaskDefinition) {}},
		{name: "http callback", mutate: func(d *modelsv1.TaskDefinition) { d.CompletionCallbackUrl = "http://cc/x" }},
		{name: "empty", mutate: func(d *modelsv1.TaskDefinition) { *d = modelsv1.TaskDefinition{} },
			want: []string{"definition.rootfs", "definition.action"}},
		{name: "bad", limits: Limits{MaxAnnotationBytes: 1, MaxPropertyBytes: 2}, mutate: func(d *modelsv1.TaskDefinition) {
			d.Rootfs = "alpine"
			d.Action = serial()
			d.MemoryMb = -1
			d.DiskMb = -1
			d.MaxPids = -1
			d.CpuWeight = 1000
			d.PlacementConstraint = &modelsv1.PlacementConstraint{Require: []string{" "}}
			d.Properties = map[string]string{"key": "value"}
			d.Labels = map[string]string{"a": "-"}
			d.CompletionCallbackUrl = "ftp://cc/x"
			d.Annotation = "ab"
			d.Env = []*modelsv1.EnvironmentVariable{{}}
			d.MaxRejections = -1
		}, want: []string{
			"definition.rootfs", "definition.action.serial.actions", "definition.memory_mb", "definition.disk_mb",
			"definition.max_pids", "definition.cpu_weight", "definition.placement_constraint.require[0]",
			"definition.properties", `definition.labels["a"]`, "definition.completion_callback_url",
			"definition.annotation", "definition.env[0].name", "definition.max_rejections",
		}},
		{name: "relative callback", mutate: func(d *modelsv1.TaskDefinition) { d.CompletionCallbackUrl = "/done" },
			want: []string{"definition.completion_callback_url"}},
		{name: "log drains", mutate: func(d *modelsv1.TaskDefinition) {
			d.LogDrains = []string{"syslog://h:514", "https://logs.example.com:443", "syslog-tls://h:6514"}
		}, want: []string{"definition.log_drains[1]"}},
		{name: "too many log drains", mutate: func(d *modelsv1.TaskDefinition) {
			d.LogDrains = slices.Repeat([]string{"syslog://h:514"}, MaxLogDrains+1)
		}, want: []string{"definition.log_drains"}},
		{name: "image credentials", mutate: func(d *modelsv1.TaskDefinition) {
			d.Rootfs, d.ImageUsername, d.ImagePassword = "docker:///app#1", "u", "p"
		}},
		{name: "image user without password", mutate: func(d *modelsv1.TaskDefinition) {
			d.Rootfs, d.ImageUsername = "docker:///app#1", "u"
		}, want: []string{"definition.image_password"}},
		{name: "image password without user", mutate: func(d *modelsv1.TaskDefinition) {
			d.Rootfs, d.ImagePassword = "docker:///app#1", "p"
		}, want: []string{"definition.image_username"}},
		{name: "image credentials for a preloaded rootfs", mutate: func(d *modelsv1.TaskDefinition) {
			d.Rootfs, d.ImageUsername, d.ImagePassword = "preloaded:cflinuxfs4", "u", "p"
		}, want: []string{"definition.image_username"}},
		{name: "long image password", mutate: func(d *modelsv1.TaskDefinition) {
			d.Rootfs, d.ImageUsername, d.ImagePassword = "docker:///app#1", "u", strings.Repeat("p", 5000)
		}, want: []string{"definition.image_password"}},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			d := validTask()
			tt.mutate(d)
			assertFields(t, ValidateTaskDefinition("definition", d, tt.limits), tt.want)
		})
	}
	assertFields(t, ValidateTaskDefinition("definition", nil, Limits{}), []string{"definition"})
}

func TestValidateDesiredLRPUpdate(t *testing.T) {
	tests := []struct {
		name   string
		update *modelsv1.DesiredLRPUpdate
		want   []string
	}{
		{"empty", &modelsv1.DesiredLRPUpdate{}, nil},
		{"nil", nil, []string{"update"}},
		{"valid", &modelsv1.DesiredLRPUpdate{
			Instances:  proto.Int32(0),
			Routes:     &modelsv1.RoutesUpdate{},
			Annotation: proto.String(""),
			Labels:     &modelsv1.LabelsUpdate{Labels: map[string]string{"a": "b"}},
			Rootfs:     proto.String("anything"),
		}, nil},
		{"bad", &modelsv1.DesiredLRPUpdate{
			Instances:  proto.Int32(1001),
			Routes:     &modelsv1.RoutesUpdate{Routes: map[string][]byte{"cf-router": []byte("{")}},
			Annotation: proto.String(strings.Repeat("a", DefaultMaxAnnotationBytes+1)),
			Labels:     &modelsv1.LabelsUpdate{Labels: map[string]string{"a b": ""}},
		}, []string{"update.instances", `update.routes.routes["cf-router"]`, "update.annotation", `update.labels.labels["a b"]`}},
		{"negative instances", &modelsv1.DesiredLRPUpdate{Instances: proto.Int32(-1)}, []string{"update.instances"}},
		{"log drains", &modelsv1.DesiredLRPUpdate{LogDrains: &modelsv1.LogDrainsUpdate{LogDrains: []string{"syslog://h:514", "https://h:443"}}},
			[]string{"update.log_drains.log_drains[1]"}},
		{"no log drains", &modelsv1.DesiredLRPUpdate{LogDrains: &modelsv1.LogDrainsUpdate{}}, nil},
		{"too many log drains", &modelsv1.DesiredLRPUpdate{LogDrains: &modelsv1.LogDrainsUpdate{LogDrains: slices.Repeat([]string{"syslog://h:514"}, MaxLogDrains+1)}},
			[]string{"update.log_drains.log_drains"}},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			assertFields(t, ValidateDesiredLRPUpdate("update", tt.update, DefaultLimits()), tt.want)
		})
	}
}

func TestCheckImmutable(t *testing.T) {
	stored := validLRP()
	tests := []struct {
		name   string
		stored *modelsv1.DesiredLRP
		update *modelsv1.DesiredLRPUpdate
		want   []string
	}{
		{"nothing set", stored, &modelsv1.DesiredLRPUpdate{Instances: proto.Int32(1)}, nil},
		{"nil update", stored, nil, nil},
		{"same values", stored, &modelsv1.DesiredLRPUpdate{
			Rootfs: proto.String("preloaded:cflinuxfs4"),
			Ports:  &modelsv1.PortsUpdate{Ports: []uint32{8080, 2222}},
			PlacementConstraint: &modelsv1.PlacementConstraint{
				Require:  []string{"skynet", "STAGING", "staging"},
				Disallow: []string{"GPU"},
			},
		}, nil},
		{"empty constraint equals none", &modelsv1.DesiredLRP{}, &modelsv1.DesiredLRPUpdate{
			PlacementConstraint: &modelsv1.PlacementConstraint{},
			Ports:               &modelsv1.PortsUpdate{},
		}, nil},
		{"changed", stored, &modelsv1.DesiredLRPUpdate{
			Rootfs:              proto.String("preloaded:cflinuxfs3"),
			Ports:               &modelsv1.PortsUpdate{Ports: []uint32{8080}},
			PlacementConstraint: &modelsv1.PlacementConstraint{Require: []string{"staging"}},
		}, []string{"update.rootfs", "update.ports", "update.placement_constraint"}},
		{"moved disallow to require", stored, &modelsv1.DesiredLRPUpdate{
			PlacementConstraint: &modelsv1.PlacementConstraint{Require: []string{"staging", "skynet", "gpu"}},
		}, []string{"update.placement_constraint"}},
		{"ports cleared", stored, &modelsv1.DesiredLRPUpdate{Ports: &modelsv1.PortsUpdate{}}, []string{"update.ports"}},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			err := CheckImmutable("update", tt.stored, tt.update)
			assertFields(t, err, tt.want)
			if err != nil && !strings.Contains(err.Error(), "is immutable") {
				t.Errorf("error %q does not say the field is immutable", err)
			}
		})
	}
}

func TestViolationMessagesNameTheField(t *testing.T) {
	err := ValidateDesiredLRP("desired_lrp", &modelsv1.DesiredLRP{}, DefaultLimits())
	for _, want := range []string{"desired_lrp.process_guid: is required", "desired_lrp.rootfs: is required"} {
		if !strings.Contains(err.Error(), want) {
			t.Errorf("error %q does not contain %q", err, want)
		}
	}
}
