package cni

import (
	"context"
	"encoding/json"
	"net"
	"os"
	"path/filepath"
	"reflect"
	"slices"
	"strconv"
	"strings"
	"testing"
	"time"
)

// TestAttachDetach attaches a namespace to the generated chain (real bridge, host-local,
// portmap and loopback), reaches a listener inside it through the host port and the
// container address, then detaches and lists what is left: nothing.
func TestAttachDetach(t *testing.T) {
	needNetworking(t)
	env := newTestEnv(t)
	ns := newNetns(t)
	ports := &testPorts{}
	ctx := context.Background()
	n, err := New(ctx, env.cfg, ports)
	if err != nil {
		t.Fatal(err)
	}
	id := "gavel-test-" + randHex(t, 6)
	att, err := n.Attach(ctx, AttachRequest{ContainerID: id, NetnsPath: ns.path, Ports: []uint32{8080, 9090}})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = n.Detach(context.Background(), id, ns.path, att.Ports) }) // in case the test stops early
	t.Logf("attachment: %+v", att)

	_, subnet, _ := net.ParseCIDR(env.cfg.Subnet)
	if ip := net.ParseIP(att.IP); ip == nil || !subnet.Contains(ip) {
		t.Fatalf("container address %q is not in %s", att.IP, subnet)
	}
	addrs := netnsAddrs(t, ns)
	if !slices.ContainsFunc(addrs, func(a string) bool { return strings.HasPrefix(a, "eth0 "+att.IP+"/") }) {
		t.Fatalf("namespace addresses %v lack eth0 %s", addrs, att.IP)
	}
	if !slices.ContainsFunc(addrs, func(a string) bool { return strings.HasPrefix(a, "lo 127.0.0.1/") }) {
		t.Fatalf("namespace addresses %v lack lo 127.0.0.1 (loopback plugin)", addrs)
	}
	if len(att.Ports) != 2 || att.Ports[0].ContainerPort != 8080 || att.Ports[1].ContainerPort != 9090 ||
		att.Ports[0].HostPort == 0 || att.Ports[1].HostPort == 0 {
		t.Fatalf("port mappings %+v, want 8080 and 9090 each on a host port", att.Ports)
	}
	for _, pm := range att.Ports {
		reply := "hello from " + strconv.Itoa(int(pm.ContainerPort))
		serveInNetns(t, ns.path, pm.ContainerPort, reply)
		for _, addr := range []string{
			net.JoinHostPort("127.0.0.1", strconv.Itoa(int(pm.HostPort))),
			net.JoinHostPort(att.IP, strconv.Itoa(int(pm.ContainerPort))),
		} {
			got, err := fetch(addr)
			if err != nil || got != reply {
				t.Errorf("from the host, %s answered %q, %v; want %q", addr, got, err, reply)
			}
		}
	}
	if att.HostInterface == "" || !slices.Contains(linksOn(t, env.cfg.Bridge), att.HostInterface) {
		t.Errorf("host veth %q is not on bridge %s (%v)", att.HostInterface, env.cfg.Bridge, linksOn(t, env.cfg.Bridge))
	}
	if got := iptablesMentioning(t, id); len(got) == 0 {
		t.Errorf("no iptables rule names %s after Attach (portmap DNAT and bridge ipMasq should)", id)
	}
	if got := ipamHolding(t, env.cfg, id); !slices.Equal(got, []string{att.IP}) {
		t.Errorf("host-local allocations for %s: %v, want [%s]", id, got, att.IP)
	}

	// A restarted rep finds the attachment again.
	restarted, err := New(ctx, env.cfg, nil)
	if err != nil {
		t.Fatal(err)
	}
	if got, ok, err := restarted.Attached(id, ns.path); err != nil || !ok || !reflect.DeepEqual(got, att) {
		t.Errorf("after a restart, Attached = %+v, %v, %v; want %+v", got, ok, err, att)
	}

	if err := n.Detach(ctx, id, ns.path, nil); err != nil {
		t.Fatal(err)
	}
	if got, ok, err := restarted.Attached(id, ns.path); err != nil || ok {
		t.Errorf("after Detach, Attached = %+v, %v, %v; want nothing", got, ok, err)
	}
	if _, err := net.InterfaceByName(att.HostInterface); err == nil {
		t.Errorf("host veth %s still exists after Detach", att.HostInterface)
	}
	if got := linksOn(t, env.cfg.Bridge); len(got) > 0 {
		t.Errorf("interfaces still on bridge %s after Detach: %v", env.cfg.Bridge, got)
	}
	if got := iptablesMentioning(t, id); len(got) > 0 {
		t.Errorf("iptables rules naming %s after Detach:\n%s", id, strings.Join(got, "\n"))
	}
	if got := ipamHolding(t, env.cfg, id); len(got) > 0 {
		t.Errorf("host-local allocations for %s after Detach: %v", id, got)
	}
	if got := netnsAddrs(t, ns); slices.ContainsFunc(got, func(a string) bool { return strings.HasPrefix(a, "eth0 ") }) {
		t.Errorf("namespace still has eth0 after Detach: %v", got)
	}
	if ports.outstanding() != 0 || len(ports.released) != 2 {
		t.Errorf("host ports: %d outstanding, released %v; want all 2 back", ports.outstanding(), ports.released)
	}
	if err := n.Detach(ctx, id, ns.path, nil); err != nil {
		t.Errorf("second Detach: %v", err)
	}
}

// TestPropertiesReachPlugins chains a recording plugin after bridge and portmap, as an
// operator's .conflist would, and checks it receives every property byte for byte in
// runtimeConfig, and the ones CNI_ARGS can carry in CNI_ARGS, on ADD and again on DEL.
func TestPropertiesReachPlugins(t *testing.T) {
	needNetworking(t)
	env := newTestEnv(t)
	env.writeConfList(t, map[string]any{
		"type":         recordPlugin,
		"recordDir":    env.recordDir,
		"capabilities": map[string]bool{PropertiesCapability: true, "portMappings": true},
	})
	ns := newNetns(t)
	ctx := context.Background()
	n, err := New(ctx, env.cfg, nil)
	if err != nil {
		t.Fatal(err)
	}
	big := strings.Repeat("0123456789abcdef", 256) // 4 KiB
	props := map[string]string{
		"app_guid":   "2a1f2c3e-5b8d-4c7e-9f10-1234567890ab",
		"network_id": "net-42",
		"unicode":    "ünïcødé ☃ 日本語 🚀",
		"big":        big,
		"json-ish":   `{"a":"<b>&c"}`,
		"empty":      "",
		"semi":       "a;b",
		"eq":         "a=b",
		"IP":         "10.0.0.9",
	}
	id := "gavel-test-" + randHex(t, 6)
	att, err := n.Attach(ctx, AttachRequest{ContainerID: id, NetnsPath: ns.path, Ports: []uint32{8080}, HostPorts: []uint32{41234}, Properties: props})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = n.Detach(context.Background(), id, ns.path, att.Ports) }) // in case the test stops early
	if want := []string{"IP", "eq", "semi"}; !slices.Equal(att.SkippedArgs, want) {
		t.Errorf("SkippedArgs %v, want %v", att.SkippedArgs, want)
	}
	if err := n.Detach(ctx, id, ns.path, nil); err != nil {
		t.Fatal(err)
	}
	wantArgs := "IgnoreUnknown=1;app_guid=" + props["app_guid"] + ";big=" + big + ";empty=;json-ish=" + props["json-ish"] +
		";network_id=net-42;unicode=" + props["unicode"]
	for _, cmd := range []string{"ADD", "DEL"} {
		stdin, err := os.ReadFile(filepath.Join(env.recordDir, cmd+".stdin"))
		if err != nil {
			t.Fatalf("%s: the recording plugin did not run: %v", cmd, err)
		}
		var conf struct {
			RuntimeConfig map[string]json.RawMessage `json:"runtimeConfig"`
		}
		if err := json.Unmarshal(stdin, &conf); err != nil {
			t.Fatalf("%s: %v", cmd, err)
		}
		var got map[string]string
		if err := json.Unmarshal(conf.RuntimeConfig[PropertiesCapability], &got); err != nil {
			t.Fatalf("%s: runtimeConfig[%q]: %v in %s", cmd, PropertiesCapability, err, stdin)
		}
		if !reflect.DeepEqual(got, props) {
			t.Errorf("%s: runtimeConfig properties differ:\n got %q\nwant %q", cmd, got, props)
		}
		var pm []portMapEntry
		if err := json.Unmarshal(conf.RuntimeConfig["portMappings"], &pm); err != nil ||
			!slices.Equal(pm, []portMapEntry{{HostPort: 41234, ContainerPort: 8080, Protocol: "tcp"}}) {
			t.Errorf("%s: runtimeConfig portMappings %s (%v)", cmd, conf.RuntimeConfig["portMappings"], err)
		}
		args, err := os.ReadFile(filepath.Join(env.recordDir, cmd+".args"))
		if err != nil {
			t.Fatal(err)
		}
		if string(args) != wantArgs {
			t.Errorf("%s: CNI_ARGS\n got %q\nwant %q", cmd, args, wantArgs)
		}
	}
}

// TestAttachFailureLeavesNothing makes the chain fail after bridge and portmap did their
// part, and checks the error names the plugin and nothing is left behind.
func TestAttachFailureLeavesNothing(t *testing.T) {
	needNetworking(t)
	for _, tc := range []struct {
		name   string
		plugin string
		before func(env testEnv) // after New, before Attach
	}{
		{name: "plugin fails", plugin: failPlugin},
		{name: "plugin removed after start", plugin: recordPlugin, before: func(env testEnv) {
			_ = os.Remove(filepath.Join(env.bin, recordPlugin))
		}},
	} {
		t.Run(tc.name, func(t *testing.T) {
			env := newTestEnv(t)
			env.writeConfList(t, map[string]any{"type": tc.plugin, "recordDir": env.recordDir})
			ns := newNetns(t)
			ports := &testPorts{}
			ctx := context.Background()
			n, err := New(ctx, env.cfg, ports)
			if err != nil {
				t.Fatal(err)
			}
			if tc.before != nil {
				tc.before(env)
			}
			id := "gavel-test-" + randHex(t, 6)
			_, err = n.Attach(ctx, AttachRequest{ContainerID: id, NetnsPath: ns.path, Ports: []uint32{8080},
				Properties: map[string]string{"app_guid": "x"}})
			if err == nil {
				t.Fatal("Attach succeeded")
			}
			t.Logf("Attach: %v", err)
			if !strings.Contains(err.Error(), `"`+tc.plugin+`"`) {
				t.Errorf("error does not name plugin %q: %v", tc.plugin, err)
			}
			if got := linksOn(t, env.cfg.Bridge); len(got) > 0 {
				t.Errorf("interfaces left on bridge %s: %v", env.cfg.Bridge, got)
			}
			if got := iptablesMentioning(t, id); len(got) > 0 {
				t.Errorf("iptables rules left naming %s:\n%s", id, strings.Join(got, "\n"))
			}
			if got := ipamHolding(t, env.cfg, id); len(got) > 0 {
				t.Errorf("host-local allocations left for %s: %v", id, got)
			}
			if got := netnsAddrs(t, ns); slices.ContainsFunc(got, func(a string) bool { return strings.HasPrefix(a, "eth0 ") }) {
				t.Errorf("namespace left with eth0: %v", got)
			}
			if ports.outstanding() != 0 {
				t.Errorf("%d host ports not given back", ports.outstanding())
			}
		})
	}
}

// TestNetns checks a pinned namespace is a namespace of its own (ip sees it, with only lo)
// and is gone after RemoveNetns, twice.
func TestNetns(t *testing.T) {
	needNetworking(t)
	name := "gavel-cni-" + randHex(t, 4)
	path, err := NewNetns(NetnsDir, name)
	if err != nil {
		t.Fatal(err)
	}
	defer RemoveNetns(path)
	links := run(t, "ip", "-n", name, "-o", "link", "show")
	if strings.Count(strings.TrimSpace(links), "\n") != 0 || !strings.Contains(links, " lo:") {
		t.Errorf("new namespace's links: %s, want only lo", links)
	}
	if _, err := NewNetns(NetnsDir, name); err == nil {
		t.Error("NewNetns with a name in use succeeded")
	}
	for range 2 {
		if err := RemoveNetns(path); err != nil {
			t.Fatal(err)
		}
	}
	if _, err := os.Stat(path); !os.IsNotExist(err) {
		t.Errorf("%s still there: %v", path, err)
	}
}

// TestAttachmentsTakeTurns: with MaxParallel attachments and detachments running their
// plugins, another waits for a turn (and gives up, saying so, when its context ends); a turn
// ended lets the next one go.
func TestAttachmentsTakeTurns(t *testing.T) {
	n := &Network{turns: make(chan struct{}, 1), owned: map[string][]uint32{}}
	if err := n.turn(context.Background()); err != nil {
		t.Fatal(err)
	}
	ctx, cancel := context.WithTimeout(context.Background(), 50*time.Millisecond)
	defer cancel()
	_, err := n.Attach(ctx, AttachRequest{ContainerID: "c1", NetnsPath: "/run/netns/c1"})
	if err == nil || !strings.Contains(err.Error(), "waiting for a turn to run the plugins (1 at once)") {
		t.Errorf("Attach while the only turn is taken: %v", err)
	}
	if err := n.Detach(ctx, "c1", "/run/netns/c1", nil); err == nil || !strings.Contains(err.Error(), "waiting for a turn") {
		t.Errorf("Detach while the only turn is taken: %v", err)
	}
	n.done()
	if err := n.turn(context.Background()); err != nil {
		t.Errorf("a turn after the last one ended: %v", err)
	}
}
