package oci

import (
	"reflect"
	"slices"
	"strings"
	"testing"
	"time"

	specs "github.com/opencontainers/runtime-spec/specs-go"

	modelsv1 "github.com/gavel-sched/gavel/pkg/gen/gavel/models/v1"
	"github.com/gavel-sched/gavel/services/rep/internal/executor"
)

func runSpec(ra *modelsv1.RunAction) executor.Spec {
	return executor.Spec{
		Guid:   "0f5a3c7e-guid",
		Action: &modelsv1.Action{Kind: &modelsv1.Action_Run{Run: ra}},
		Env:    []*modelsv1.EnvironmentVariable{{Name: "A", Value: "spec"}},
	}
}

func ptr[T any](v T) *T { return &v }

func TestBuildSpec(t *testing.T) {
	users := map[string]IDs{"vcap": {UID: 2000, GID: 2001, Home: "/home/vcap"}, "root": {Home: "/root"}}
	base := SpecConfig{RootPath: "/work/c/rootfs", Users: users, Env: []string{"PORT=8080"}}
	tests := []struct {
		name  string
		spec  func() executor.Spec
		cfg   func(SpecConfig) SpecConfig
		check func(t *testing.T, s *specs.Spec)
		err   string
	}{
		{
			name: "hooks",
			spec: func() executor.Spec { return runSpec(&modelsv1.RunAction{Path: "/bin/app"}) },
			cfg: func(c SpecConfig) SpecConfig {
				c.Hooks = Hooks{OnCreate: []string{"/etc/gavel/net.sh", "/etc/gavel/log.sh"}, OnDestroy: []string{"/etc/gavel/net.sh"}, Timeout: 1500 * time.Millisecond}
				return c
			},
			check: func(t *testing.T, s *specs.Spec) {
				h := s.Hooks
				if h == nil || len(h.CreateRuntime) != 2 || len(h.Poststop) != 1 || len(h.Prestart) != 0 {
					t.Fatalf("hooks %+v, want 2 createRuntime and 1 poststop", h)
				}
				c := h.CreateRuntime[1]
				if c.Path != "/etc/gavel/log.sh" || !reflect.DeepEqual(c.Args, []string{"/etc/gavel/log.sh"}) || c.Timeout == nil || *c.Timeout != 2 {
					t.Errorf("createRuntime hook %+v, want log.sh with a 2s timeout", c)
				}
				want := []string{"GAVEL_HOOK=on_destroy", "GAVEL_CONTAINER_GUID=0f5a3c7e-guid", "PATH=" + defaultPath}
				if !reflect.DeepEqual(h.Poststop[0].Env, want) {
					t.Errorf("poststop env %q, want %q", h.Poststop[0].Env, want)
				}
			},
		},
		{
			name: "no hooks",
			spec: func() executor.Spec { return runSpec(&modelsv1.RunAction{Path: "/bin/app"}) },
			check: func(t *testing.T, s *specs.Spec) {
				if s.Hooks != nil {
					t.Errorf("hooks %+v without any configured", s.Hooks)
				}
			},
		},
		{
			name: "defaults",
			spec: func() executor.Spec { return runSpec(&modelsv1.RunAction{Path: "/bin/app", Args: []string{"-x"}}) },
			check: func(t *testing.T, s *specs.Spec) {
				if s.Hostname != "0f5a3c7e-guid" || s.Root.Path != "/work/c/rootfs" || s.Root.Readonly {
					t.Errorf("hostname %q root %+v", s.Hostname, s.Root)
				}
				if !reflect.DeepEqual(s.Process.Args, []string{"/bin/app", "-x"}) || s.Process.Cwd != "/" {
					t.Errorf("args %q cwd %q", s.Process.Args, s.Process.Cwd)
				}
				if s.Process.User.UID != NobodyID || s.Process.User.GID != NobodyID || !s.Process.NoNewPrivileges {
					t.Errorf("user %+v nnp %v", s.Process.User, s.Process.NoNewPrivileges)
				}
				if len(s.Process.Capabilities.Effective) != 0 || len(s.Process.Capabilities.Bounding) == 0 {
					t.Errorf("capabilities of a non-root process %+v", s.Process.Capabilities)
				}
				var ns []specs.LinuxNamespaceType
				for _, n := range s.Linux.Namespaces {
					if n.Path != "" {
						t.Errorf("namespace %s joins %s", n.Type, n.Path)
					}
					ns = append(ns, n.Type)
				}
				want := []specs.LinuxNamespaceType{specs.PIDNamespace, specs.MountNamespace, specs.UTSNamespace, specs.IPCNamespace, specs.NetworkNamespace}
				if !reflect.DeepEqual(ns, want) {
					t.Errorf("namespaces %v, want %v", ns, want)
				}
				if s.Linux.CgroupsPath != "/gavel/0f5a3c7e-guid" {
					t.Errorf("cgroups path %q", s.Linux.CgroupsPath)
				}
				r := s.Linux.Resources
				if r.Memory != nil || r.Pids != nil || r.CPU != nil {
					t.Errorf("limits without limits in the spec: %+v", r)
				}
				if want := []specs.POSIXRlimit{{Type: "RLIMIT_NOFILE", Hard: DefaultNofile, Soft: DefaultNofile}}; !reflect.DeepEqual(s.Process.Rlimits, want) {
					t.Errorf("rlimits %+v", s.Process.Rlimits)
				}
				if want := []string{"HOME=/", "PATH=" + defaultPath, "A=spec", "PORT=8080"}; !reflect.DeepEqual(s.Process.Env, want) {
					t.Errorf("env %q, want %q", s.Process.Env, want)
				}
				if s.Annotations != nil {
					t.Errorf("annotations without properties: %v", s.Annotations)
				}
			},
		},
		{
			name: "limits",
			spec: func() executor.Spec {
				s := runSpec(&modelsv1.RunAction{Path: "/bin/app", NofileLimit: 4096})
				s.MemoryMB, s.MaxPids, s.CPUWeight = 64, 20, 50
				return s
			},
			cfg: func(c SpecConfig) SpecConfig { c.LimitSwap = true; c.CgroupParent = "/cells/a"; return c },
			check: func(t *testing.T, s *specs.Spec) {
				r := s.Linux.Resources
				if *r.Memory.Limit != 64<<20 || *r.Memory.Swap != 64<<20 || *r.Pids.Limit != 20 || *r.CPU.Shares != 512 {
					t.Errorf("limits memory %d swap %d pids %d shares %d", *r.Memory.Limit, *r.Memory.Swap, *r.Pids.Limit, *r.CPU.Shares)
				}
				if s.Process.Rlimits[0].Soft != 4096 || s.Process.Rlimits[0].Hard != 4096 {
					t.Errorf("nofile %+v", s.Process.Rlimits)
				}
				if s.Linux.CgroupsPath != "/cells/a/0f5a3c7e-guid" {
					t.Errorf("cgroups path %q", s.Linux.CgroupsPath)
				}
			},
		},
		{
			name: "smallest cpu weight keeps 2 shares, swap unlimited without accounting",
			spec: func() executor.Spec {
				s := runSpec(&modelsv1.RunAction{Path: "/bin/app"})
				s.CPUWeight, s.MemoryMB = 1, 8
				return s
			},
			check: func(t *testing.T, s *specs.Spec) {
				if *s.Linux.Resources.CPU.Shares != 10 || s.Linux.Resources.Memory.Swap != nil {
					t.Errorf("shares %d swap %v", *s.Linux.Resources.CPU.Shares, s.Linux.Resources.Memory.Swap)
				}
			},
		},
		{
			name: "user of the rootfs, dir, action env last",
			spec: func() executor.Spec {
				return runSpec(&modelsv1.RunAction{Path: "app", User: "vcap", Dir: "srv/app",
					Env: []*modelsv1.EnvironmentVariable{{Name: "A", Value: "action"}}})
			},
			check: func(t *testing.T, s *specs.Spec) {
				if s.Process.User.UID != 2000 || s.Process.User.GID != 2001 || s.Process.Cwd != "/srv/app" {
					t.Errorf("user %+v cwd %q", s.Process.User, s.Process.Cwd)
				}
				if s.Process.Env[0] != "HOME=/home/vcap" || s.Process.Env[len(s.Process.Env)-1] != "A=action" {
					t.Errorf("env %q", s.Process.Env)
				}
			},
		},
		{
			name: "numeric user",
			spec: func() executor.Spec { return runSpec(&modelsv1.RunAction{Path: "/a", User: "1234:99"}) },
			check: func(t *testing.T, s *specs.Spec) {
				if s.Process.User.UID != 1234 || s.Process.User.GID != 99 {
					t.Errorf("user %+v", s.Process.User)
				}
			},
		},
		{
			name: "cell default user",
			spec: func() executor.Spec { return runSpec(&modelsv1.RunAction{Path: "/a"}) },
			cfg:  func(c SpecConfig) SpecConfig { c.DefaultUser = "vcap"; return c },
			check: func(t *testing.T, s *specs.Spec) {
				if s.Process.User.UID != 2000 {
					t.Errorf("user %+v", s.Process.User)
				}
			},
		},
		{
			name: "privileged runs as root with capabilities",
			spec: func() executor.Spec {
				s := runSpec(&modelsv1.RunAction{Path: "/a"})
				s.Privileged = true
				return s
			},
			check: func(t *testing.T, s *specs.Spec) {
				if s.Process.User.UID != 0 || len(s.Process.Capabilities.Effective) == 0 || s.Process.NoNewPrivileges {
					t.Errorf("user %+v caps %+v", s.Process.User, s.Process.Capabilities)
				}
			},
		},
		{
			name: "properties become annotations as given",
			spec: func() executor.Spec {
				s := runSpec(&modelsv1.RunAction{Path: "/a"})
				s.Properties = map[string]string{"app_guid": "a1", "network.policy": "ünï €", "big": strings.Repeat("x", 4096)}
				return s
			},
			check: func(t *testing.T, s *specs.Spec) {
				want := map[string]string{"app_guid": "a1", "network.policy": "ünï €", "big": strings.Repeat("x", 4096)}
				if !reflect.DeepEqual(s.Annotations, want) {
					t.Errorf("annotations %v", s.Annotations)
				}
			},
		},
		{
			name: "long guid cut to the hostname limit",
			spec: func() executor.Spec {
				s := runSpec(&modelsv1.RunAction{Path: "/a"})
				s.Guid = strings.Repeat("g", 80)
				return s
			},
			check: func(t *testing.T, s *specs.Spec) {
				if len(s.Hostname) != MaxHostname {
					t.Errorf("hostname %q", s.Hostname)
				}
			},
		},
		{name: "root refused unless privileged", spec: func() executor.Spec { return runSpec(&modelsv1.RunAction{Path: "/a", User: "root"}) }, err: "only privileged work may run as root"},
		{name: "unknown user", spec: func() executor.Spec { return runSpec(&modelsv1.RunAction{Path: "/a", User: "alice"}) }, err: `user "alice" is not in the rootfs's /etc/passwd`},
		{name: "empty path", spec: func() executor.Spec { return runSpec(&modelsv1.RunAction{}) }, err: "empty path"},
		{
			name: "a tree runs the init program",
			spec: func() executor.Spec {
				s := runSpec(&modelsv1.RunAction{Path: "/a"})
				s.Action = &modelsv1.Action{Kind: &modelsv1.Action_Serial{Serial: &modelsv1.SerialAction{Actions: []*modelsv1.Action{s.Action, s.Action}}}}
				return s
			},
			cfg: func(c SpecConfig) SpecConfig { c.InitPath = "/work/g/init"; return c },
			check: func(t *testing.T, s *specs.Spec) {
				if len(s.Process.Args) != 1 || s.Process.Args[0] != InitMount || s.Process.User.UID != NobodyID || !s.Process.NoNewPrivileges {
					t.Errorf("init process %+v, want the init program as nobody", s.Process)
				}
				last := s.Mounts[len(s.Mounts)-1]
				if last.Destination != InitMount || last.Source != "/work/g/init" || !slices.Contains(last.Options, "ro") {
					t.Errorf("last mount %+v, want the init program read-only", last)
				}
			},
		},
		{
			name: "a tree without the init program",
			spec: func() executor.Spec {
				s := runSpec(&modelsv1.RunAction{Path: "/a"})
				s.Setup = s.Action
				return s
			},
			err: "needs the init program",
		},
		{
			name: "downloads in setup and serial",
			spec: func() executor.Spec {
				s := runSpec(&modelsv1.RunAction{Path: "/a"})
				dl := func(to string) *modelsv1.Action {
					return &modelsv1.Action{Kind: &modelsv1.Action_Download{Download: &modelsv1.DownloadAction{From: "http://x/" + to, To: to}}}
				}
				s.Setup = &modelsv1.Action{Kind: &modelsv1.Action_Serial{Serial: &modelsv1.SerialAction{Actions: []*modelsv1.Action{dl("/1"), dl("/2")}}}}
				s.Action = &modelsv1.Action{Kind: &modelsv1.Action_Serial{Serial: &modelsv1.SerialAction{Actions: []*modelsv1.Action{dl("/3"), s.Action}}}}
				return s
			},
			check: func(t *testing.T, s *specs.Spec) {
				if len(s.Process.Args) != 1 || s.Process.Args[0] != "/a" {
					t.Errorf("args %q, want the serial's run action", s.Process.Args)
				}
			},
		},
		{name: "no root path", spec: func() executor.Spec { return runSpec(&modelsv1.RunAction{Path: "/a"}) }, cfg: func(c SpecConfig) SpecConfig { c.RootPath = ""; return c }, err: "no root path"},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			cfg := base
			if tc.cfg != nil {
				cfg = tc.cfg(cfg)
			}
			s, err := BuildSpec(tc.spec(), cfg)
			if tc.err != "" {
				if err == nil || !strings.Contains(err.Error(), tc.err) {
					t.Fatalf("BuildSpec error = %v, want %q", err, tc.err)
				}
				return
			}
			if err != nil {
				t.Fatalf("BuildSpec: %v", err)
			}
			tc.check(t, s)
		})
	}
}

// TestDownloads: the download actions run in order, the setup's first, then those before the
// run action of a serial action.
func TestDownloads(t *testing.T) {
	dl := func(to string) *modelsv1.Action {
		return &modelsv1.Action{Kind: &modelsv1.Action_Download{Download: &modelsv1.DownloadAction{From: "http://x" + to, To: to}}}
	}
	run := &modelsv1.Action{Kind: &modelsv1.Action_Run{Run: &modelsv1.RunAction{Path: "/a"}}}
	s := executor.Spec{
		Setup:  &modelsv1.Action{Kind: &modelsv1.Action_Serial{Serial: &modelsv1.SerialAction{Actions: []*modelsv1.Action{dl("/1"), dl("/2")}}}},
		Action: &modelsv1.Action{Kind: &modelsv1.Action_Serial{Serial: &modelsv1.SerialAction{Actions: []*modelsv1.Action{dl("/3"), run}}}},
	}
	ds, err := Downloads(s)
	var got []string
	for _, d := range ds {
		got = append(got, d.GetTo())
	}
	if err != nil || strings.Join(got, " ") != "/1 /2 /3" {
		t.Errorf("Downloads = %q, %v; want /1 /2 /3", got, err)
	}
	s.Setup = dl("/only")
	s.Action = run
	if ds, err := Downloads(s); err != nil || len(ds) != 1 || ds[0].GetTo() != "/only" {
		t.Errorf("Downloads of a setup download = %v, %v", ds, err)
	}
}
