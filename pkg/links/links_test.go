package links

import (
	"encoding/json"
	"errors"
	"strings"
	"testing"

	"google.golang.org/protobuf/proto"
	"google.golang.org/protobuf/types/known/timestamppb"

	modelsv1 "github.com/gavel-sched/gavel/pkg/gen/gavel/models/v1"
)

func provide(name, typ string, opts ...func(*modelsv1.LinkProvide)) *modelsv1.LinkProvide {
	p := &modelsv1.LinkProvide{Name: name, Type: typ}
	for _, o := range opts {
		o(p)
	}
	return p
}

func as(a string) func(*modelsv1.LinkProvide)   { return func(p *modelsv1.LinkProvide) { p.As = a } }
func shared(p *modelsv1.LinkProvide)            { p.Shared = true }
func port(n uint32) func(*modelsv1.LinkProvide) { return func(p *modelsv1.LinkProvide) { p.Port = n } }
func props(kv ...string) func(*modelsv1.LinkProvide) {
	return func(p *modelsv1.LinkProvide) {
		p.Properties = map[string]string{}
		for i := 0; i+1 < len(kv); i += 2 {
			p.Properties[kv[i]] = kv[i+1]
		}
	}
}

func lrp(guid, domain string, ports []uint32, provides []*modelsv1.LinkProvide, consumes ...*modelsv1.LinkConsume) LRP {
	return LRP{Guid: guid, Domain: domain, Ports: ports, Links: &modelsv1.Links{Provides: provides, Consumes: consumes}}
}

// running instance idx of guid on cell, zone z, cell address addr, mapping container port cp to
// host port hp.
// draining marks a as withdrawn from routing before a stop (draining_since set).
func draining(a *modelsv1.ActualLRP) *modelsv1.ActualLRP {
	a.DrainingSince = timestamppb.Now()
	a.Routable = false
	return a
}

func inst(guid string, idx int32, cell, z, addr string, cp, hp uint32) *modelsv1.ActualLRP {
	return &modelsv1.ActualLRP{
		Key:         &modelsv1.ActualLRPKey{ProcessGuid: guid, Index: idx, Domain: "cf"},
		InstanceKey: &modelsv1.ActualLRPInstanceKey{InstanceGuid: guid + "-" + string(rune('a'+idx)), CellId: cell},
		State:       modelsv1.ActualLRP_STATE_RUNNING,
		Presence:    modelsv1.ActualLRP_PRESENCE_ORDINARY,
		Zone:        z,
		NetInfo: &modelsv1.ActualLRPNetInfo{
			Address: addr, InstanceAddress: "10.255.0." + string(rune('1'+idx)),
			Ports: []*modelsv1.PortMapping{{ContainerPort: cp, HostPort: hp}},
		},
	}
}

func state(a *modelsv1.ActualLRP, s modelsv1.ActualLRP_State) *modelsv1.ActualLRP {
	a.State = s
	return a
}

type world map[string][]*modelsv1.ActualLRP

func (w world) get(guid string) []*modelsv1.ActualLRP { return w[guid] }

func lnode(name, id string, idx int32, az, addr string) *modelsv1.LinkNode {
	return &modelsv1.LinkNode{Name: name, Id: id, Index: idx, Az: az, Address: addr}
}

func rlink(nodes []*modelsv1.LinkNode, kv ...string) *modelsv1.ResolvedLink {
	p := map[string]string{}
	for i := 0; i+1 < len(kv); i += 2 {
		p[kv[i]] = kv[i+1]
	}
	return &modelsv1.ResolvedLink{Nodes: nodes, Properties: p}
}

func TestResolve(t *testing.T) {
	dataNodes := world{
		"node": {
			inst("node", 1, "cell-2", "z1", "10.0.0.45", 3306, 61001),
			inst("node", 0, "cell-1", "z1", "10.0.0.44", 3306, 61000),
		},
	}
	// The proposal's MySQL release: node provides and consumes data-node, proxy consumes it.
	node0 := lnode("data-node", "node-a", 0, "z1", "10.0.0.44:61000")
	node1 := lnode("data-node", "node-b", 1, "z1", "10.0.0.45:61001")
	mysqlNode := lrp("node", "cf", []uint32{3306},
		[]*modelsv1.LinkProvide{provide("data-node", "data-node", port(3306), props("admin_user", "admin-user", "admin_password", "some-secret", "public_key", "..."))},
		&modelsv1.LinkConsume{Name: "data-node", Type: "data-node"})
	dbProps := []string{"admin_user", "admin-user", "admin_password", "some-secret", "public_key", "..."}

	tests := []struct {
		name     string
		lrps     []LRP
		world    world
		consumer string
		cell     string
		want     map[string]*modelsv1.ResolvedLink
		wantErr  string
		// cellMisses: no provider instance runs on the consumer's cell, so moving them all
		// changes nothing.
		cellMisses bool
	}{
		{
			name: "provider and consumer by type: every running node ordered by index, with properties",
			lrps: []LRP{mysqlNode, lrp("proxy", "cf", nil, nil,
				&modelsv1.LinkConsume{Name: "data-node", Type: "data-node"})},
			world:    dataNodes,
			consumer: "proxy",
			want:     map[string]*modelsv1.ResolvedLink{"data-node": rlink([]*modelsv1.LinkNode{node0, node1}, dbProps...)},
		},
		{
			name:     "an LRP consumes the link it provides itself",
			lrps:     []LRP{mysqlNode},
			world:    dataNodes,
			consumer: "node",
			want:     map[string]*modelsv1.ResolvedLink{"data-node": rlink([]*modelsv1.LinkNode{node0, node1}, dbProps...)},
		},
		{
			name: "explicit from by name",
			lrps: []LRP{mysqlNode, lrp("proxy", "cf", nil, nil,
				&modelsv1.LinkConsume{Name: "nodes", Type: "data-node", From: "data-node"})},
			world:    dataNodes,
			consumer: "proxy",
			want:     map[string]*modelsv1.ResolvedLink{"nodes": rlink([]*modelsv1.LinkNode{node0, node1}, dbProps...)},
		},
		{
			name: "two providers of one type without from: ambiguous, candidates listed",
			lrps: []LRP{
				lrp("nats", "cf", nil, []*modelsv1.LinkProvide{provide("nats", "nats")}),
				lrp("other-nats", "cf", nil, []*modelsv1.LinkProvide{provide("nats", "nats", as("other-nats"))}),
				lrp("node", "cf", nil, nil, &modelsv1.LinkConsume{Name: "nats", Type: "nats"}),
			},
			consumer: "node",
			wantErr: `cannot resolve links of desired lrp "node":
  - link "nats": 2 providers of type "nats" in domain "cf": lrp "nats" link "nats", lrp "other-nats" link "nats" as "other-nats"; set from to choose one`,
		},
		{
			name: "two providers of one type with from naming the alias",
			lrps: []LRP{
				lrp("nats", "cf", nil, []*modelsv1.LinkProvide{provide("nats", "nats", port(4222))}),
				lrp("other-nats", "cf", []uint32{4222}, []*modelsv1.LinkProvide{provide("nats", "nats", as("other-nats"), port(4222))}),
				lrp("node", "cf", nil, nil, &modelsv1.LinkConsume{Name: "nats", Type: "nats", From: "other-nats"}),
			},
			world:    world{"other-nats": {inst("other-nats", 0, "cell-1", "z2", "10.0.0.9", 4222, 62000)}},
			consumer: "node",
			want:     map[string]*modelsv1.ResolvedLink{"nats": rlink([]*modelsv1.LinkNode{lnode("nats", "other-nats-a", 0, "z2", "10.0.0.9:62000")})},
		},
		{
			name: "an alias hides the original name",
			lrps: []LRP{
				lrp("other-nats", "cf", nil, []*modelsv1.LinkProvide{provide("nats", "nats", as("other-nats"))}),
				lrp("node", "cf", nil, nil, &modelsv1.LinkConsume{Name: "nats", From: "nats"}),
			},
			consumer: "node",
			wantErr: `cannot resolve links of desired lrp "node":
  - link "nats": no provider named "nats" in domain "cf" (lrp "other-nats" link "nats" as "other-nats" hides the name behind its alias)`,
		},
		{
			name: "primary_db and backup_db of one type, each by name",
			lrps: []LRP{
				lrp("mysql-a", "cf", []uint32{3306}, []*modelsv1.LinkProvide{provide("db", "db", as("primary"), port(3306))}),
				lrp("mysql-b", "cf", []uint32{3306}, []*modelsv1.LinkProvide{provide("db", "db", as("backup"), port(3306))}),
				lrp("web", "cf", nil, nil,
					&modelsv1.LinkConsume{Name: "primary_db", Type: "db", From: "primary"},
					&modelsv1.LinkConsume{Name: "backup_db", Type: "db", From: "backup"}),
			},
			world: world{
				"mysql-a": {inst("mysql-a", 0, "cell-1", "z1", "10.0.0.1", 3306, 61000)},
				"mysql-b": {inst("mysql-b", 0, "cell-2", "z2", "10.0.0.2", 3306, 61000)},
			},
			consumer: "web",
			want: map[string]*modelsv1.ResolvedLink{
				"primary_db": rlink([]*modelsv1.LinkNode{lnode("db", "mysql-a-a", 0, "z1", "10.0.0.1:61000")}),
				"backup_db":  rlink([]*modelsv1.LinkNode{lnode("db", "mysql-b-a", 0, "z2", "10.0.0.2:61000")}),
			},
		},
		{
			name: "primary_db and backup_db of one type without from: both ambiguous, both listed",
			lrps: []LRP{
				lrp("mysql-a", "cf", nil, []*modelsv1.LinkProvide{provide("db", "db", as("primary"))}),
				lrp("mysql-b", "cf", nil, []*modelsv1.LinkProvide{provide("db", "db", as("backup"))}),
				lrp("web", "cf", nil, nil,
					&modelsv1.LinkConsume{Name: "primary_db", Type: "db"},
					&modelsv1.LinkConsume{Name: "backup_db", Type: "db"}),
			},
			consumer: "web",
			wantErr: `cannot resolve links of desired lrp "web":
  - link "primary_db": 2 providers of type "db" in domain "cf": lrp "mysql-a" link "db" as "primary", lrp "mysql-b" link "db" as "backup"; set from to choose one
  - link "backup_db": 2 providers of type "db" in domain "cf": lrp "mysql-a" link "db" as "primary", lrp "mysql-b" link "db" as "backup"; set from to choose one`,
		},
		{
			name: "across domains to a shared provider",
			lrps: []LRP{
				lrp("nats", "other-dep", []uint32{4222}, []*modelsv1.LinkProvide{provide("nats", "nats", shared, port(4222))}),
				lrp("node", "cf", nil, nil, &modelsv1.LinkConsume{Name: "nats", From: "other-dep.nats"}),
			},
			world:    world{"nats": {inst("nats", 0, "cell-1", "z1", "10.0.0.7", 4222, 60001)}},
			consumer: "node",
			want:     map[string]*modelsv1.ResolvedLink{"nats": rlink([]*modelsv1.LinkNode{lnode("nats", "nats-a", 0, "z1", "10.0.0.7:60001")})},
		},
		{
			name: "across domains to a provider that is not shared",
			lrps: []LRP{
				lrp("nats", "other-dep", nil, []*modelsv1.LinkProvide{provide("nats", "nats")}),
				lrp("node", "cf", nil, nil, &modelsv1.LinkConsume{Name: "nats", From: "other-dep.nats"}),
			},
			consumer: "node",
			wantErr: `cannot resolve links of desired lrp "node":
  - link "nats": provider "nats" in domain "other-dep" is not shared`,
		},
		{
			name: "by type never crosses domains, even to a shared provider",
			lrps: []LRP{
				lrp("nats", "other-dep", nil, []*modelsv1.LinkProvide{provide("nats", "nats", shared)}),
				lrp("node", "cf", nil, nil, &modelsv1.LinkConsume{Name: "nats", Type: "nats"}),
			},
			consumer: "node",
			wantErr: `cannot resolve links of desired lrp "node":
  - link "nats": no provider of type "nats" in domain "cf"`,
		},
		{
			name: "two providers exposing one name: from is ambiguous too",
			lrps: []LRP{
				lrp("nats-1", "cf", nil, []*modelsv1.LinkProvide{provide("nats", "nats")}),
				lrp("nats-2", "cf", nil, []*modelsv1.LinkProvide{provide("bus", "nats", as("nats"))}),
				lrp("node", "cf", nil, nil, &modelsv1.LinkConsume{Name: "nats", From: "nats"}),
			},
			consumer: "node",
			wantErr: `cannot resolve links of desired lrp "node":
  - link "nats": 2 providers named "nats" in domain "cf": lrp "nats-1" link "nats", lrp "nats-2" link "bus" as "nats"`,
		},
		{
			name: "a dotted name in the consumer's own domain is a name, not a domain",
			lrps: []LRP{
				lrp("v2", "cf", nil, []*modelsv1.LinkProvide{provide("api.v2", "api")}),
				lrp("node", "cf", nil, nil, &modelsv1.LinkConsume{Name: "api", From: "api.v2"}),
			},
			consumer: "node",
			want:     map[string]*modelsv1.ResolvedLink{"api": rlink(nil)},
		},
		{
			name: "from names a provider of another type",
			lrps: []LRP{
				lrp("redis", "cf", nil, []*modelsv1.LinkProvide{provide("cache", "redis")}),
				lrp("web", "cf", nil, nil, &modelsv1.LinkConsume{Name: "db", Type: "mysql", From: "cache"}),
			},
			consumer: "web",
			wantErr: `cannot resolve links of desired lrp "web":
  - link "db": provider "cache" in domain "cf" has type "redis", not "mysql"`,
		},
		{
			name: "network instance: instance address and container port",
			lrps: []LRP{
				lrp("nats", "cf", []uint32{4222}, []*modelsv1.LinkProvide{provide("nats", "nats", port(4222))}),
				lrp("node", "cf", nil, nil, &modelsv1.LinkConsume{Name: "nats", From: "nats", Network: "instance"}),
			},
			world:    world{"nats": {inst("nats", 0, "cell-1", "z1", "10.0.0.7", 4222, 60001)}},
			consumer: "node",
			want:     map[string]*modelsv1.ResolvedLink{"nats": rlink([]*modelsv1.LinkNode{lnode("nats", "nats-a", 0, "z1", "10.255.0.1:4222")})},
		},
		{
			name: "without network the only network offered is the default",
			lrps: []LRP{
				lrp("nats", "cf", nil, []*modelsv1.LinkProvide{provide("nats", "nats", port(4222))}),
				lrp("node", "cf", nil, nil, &modelsv1.LinkConsume{Name: "nats", From: "nats"}),
			},
			world:    world{"nats": {inst("nats", 0, "cell-1", "z1", "10.0.0.7", 8080, 60001)}},
			consumer: "node",
			want:     map[string]*modelsv1.ResolvedLink{"nats": rlink([]*modelsv1.LinkNode{lnode("nats", "nats-a", 0, "z1", "10.255.0.1:4222")})},
		},
		{
			name: "a network the provider does not offer, and an unknown network, are both errors",
			lrps: []LRP{
				lrp("nats", "cf", []uint32{8080}, []*modelsv1.LinkProvide{provide("nats", "nats", port(4222))}),
				lrp("node", "cf", nil, nil,
					&modelsv1.LinkConsume{Name: "nats", From: "nats", Network: "host"},
					&modelsv1.LinkConsume{Name: "nats-vip", From: "nats", Network: "vip"}),
			},
			consumer: "node",
			wantErr: `cannot resolve links of desired lrp "node":
  - link "nats": lrp "nats" link "nats" does not offer network "host": port 4222 is not among the lrp's ports
  - link "nats-vip": lrp "nats" link "nats" does not offer network "vip" (networks: "host", "instance")`,
		},
		{
			name: "colocated metron: the consumer instance's cell only, as a single node",
			lrps: []LRP{
				lrp("metron", "cf", []uint32{3457}, []*modelsv1.LinkProvide{provide("metron", "metron", as("node_metron"), port(3457))}),
				lrp("node", "cf", nil, nil, &modelsv1.LinkConsume{Name: "metron", Type: "metron", From: "node_metron", Colocated: true}),
			},
			world: world{"metron": {
				inst("metron", 0, "cell-1", "z1", "10.0.0.44", 3457, 60100),
				inst("metron", 1, "cell-2", "z1", "10.0.0.45", 3457, 60100),
			}},
			consumer: "node",
			cell:     "cell-2",
			want: map[string]*modelsv1.ResolvedLink{"metron": {
				Node: lnode("metron", "metron-b", 1, "z1", "10.0.0.45:60100"), Properties: map[string]string{},
			}},
		},
		{
			name: "colocated without a provider instance on the cell: no node",
			lrps: []LRP{
				lrp("metron", "cf", []uint32{3457}, []*modelsv1.LinkProvide{provide("metron", "metron", port(3457))}),
				lrp("node", "cf", nil, nil, &modelsv1.LinkConsume{Name: "metron", Type: "metron", Colocated: true}),
			},
			world:      world{"metron": {inst("metron", 0, "cell-1", "z1", "10.0.0.44", 3457, 60100)}},
			consumer:   "node",
			cell:       "cell-9",
			cellMisses: true,
			want:       map[string]*modelsv1.ResolvedLink{"metron": {Properties: map[string]string{}}},
		},
		{
			name: "custom link to an external service",
			lrps: []LRP{lrp("node", "cf", nil, nil, &modelsv1.LinkConsume{Name: "nats", Custom: &modelsv1.ResolvedLink{
				Nodes:      []*modelsv1.LinkNode{{Name: "nats", Id: "ext-0", Address: "nats.example.com:4222"}},
				Properties: map[string]string{"user": "nats"},
			}})},
			consumer: "node",
			want:     map[string]*modelsv1.ResolvedLink{"nats": rlink([]*modelsv1.LinkNode{lnode("nats", "ext-0", 0, "", "nats.example.com:4222")}, "user", "nats")},
		},
		{
			name:     "custom link without nodes",
			lrps:     []LRP{lrp("node", "cf", nil, nil, &modelsv1.LinkConsume{Name: "nats", Custom: &modelsv1.ResolvedLink{}})},
			consumer: "node",
			wantErr: `cannot resolve links of desired lrp "node":
  - link "nats": custom link has no nodes`,
		},
		{
			name: "optional link without a provider: no link, no error",
			lrps: []LRP{
				lrp("mysql", "cf", nil, []*modelsv1.LinkProvide{provide("db", "db")}),
				lrp("web", "cf", nil, nil,
					&modelsv1.LinkConsume{Name: "cache", Type: "redis", Optional: true},
					&modelsv1.LinkConsume{Name: "db", Type: "db"}),
			},
			consumer: "web",
			want:     map[string]*modelsv1.ResolvedLink{"db": rlink(nil)},
		},
		{
			name: "zero-instance provider: empty nodes",
			lrps: []LRP{
				lrp("mysql", "cf", nil, []*modelsv1.LinkProvide{provide("db", "db", props("user", "u"))}),
				lrp("web", "cf", nil, nil, &modelsv1.LinkConsume{Name: "db", Type: "db"}),
			},
			consumer: "web",
			want:     map[string]*modelsv1.ResolvedLink{"db": rlink(nil, "user", "u")},
		},
		{
			name: "only RUNNING instances are nodes; a crashed, starting or draining one is left out",
			lrps: []LRP{
				lrp("mysql", "cf", []uint32{3306}, []*modelsv1.LinkProvide{provide("db", "db", port(3306))}),
				lrp("web", "cf", nil, nil, &modelsv1.LinkConsume{Name: "db", Type: "db"}),
			},
			world: world{"mysql": {
				inst("mysql", 0, "cell-1", "z1", "10.0.0.1", 3306, 61000),
				state(inst("mysql", 1, "cell-1", "z1", "10.0.0.1", 3306, 61001), modelsv1.ActualLRP_STATE_CRASHED),
				state(inst("mysql", 2, "cell-1", "z1", "10.0.0.1", 3306, 61002), modelsv1.ActualLRP_STATE_CLAIMED),
				draining(inst("mysql", 3, "cell-1", "z1", "10.0.0.1", 3306, 61003)),
			}},
			consumer: "web",
			want:     map[string]*modelsv1.ResolvedLink{"db": rlink([]*modelsv1.LinkNode{lnode("db", "mysql-a", 0, "z1", "10.0.0.1:61000")})},
		},
		{
			name: "every failure of one LRP in one error, one line per link",
			lrps: []LRP{
				lrp("nats", "other-dep", nil, []*modelsv1.LinkProvide{provide("nats", "nats")}),
				lrp("web", "cf", nil, nil,
					&modelsv1.LinkConsume{Name: "db", Type: "mysql"},
					&modelsv1.LinkConsume{Name: "nats", From: "other-dep.nats"},
					&modelsv1.LinkConsume{Name: "ext", Custom: &modelsv1.ResolvedLink{}}),
			},
			consumer: "web",
			wantErr: `cannot resolve links of desired lrp "web":
  - link "db": no provider of type "mysql" in domain "cf"
  - link "nats": provider "nats" in domain "other-dep" is not shared
  - link "ext": custom link has no nodes`,
		},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			x := IndexOf(tt.lrps...)
			c := x.LRP(tt.consumer)
			if c == nil {
				t.Fatalf("consumer %q not indexed", tt.consumer)
			}
			got, err := x.Resolve(*c, tt.world.get, tt.cell)
			if tt.wantErr != "" {
				if err == nil || err.Error() != tt.wantErr {
					t.Fatalf("error:\n%v\nwant:\n%s", err, tt.wantErr)
				}
				var le *Error
				if !errors.As(err, &le) || le.Guid != tt.consumer {
					t.Fatalf("error %T is not a *Error for %q", err, tt.consumer)
				}
				if cerr := x.Check(*c); cerr == nil || cerr.Error() != tt.wantErr {
					t.Fatalf("Check: %v, want the same error", cerr)
				}
				return
			}
			if err != nil {
				t.Fatalf("resolve: %v", err)
			}
			if len(got.Links) != len(tt.want) {
				t.Fatalf("links %v, want %v", got.Links, tt.want)
			}
			for name, w := range tt.want {
				if !proto.Equal(got.Links[name], w) {
					t.Errorf("link %q:\n got %v\nwant %v", name, got.Links[name], w)
				}
			}
			if err := x.Check(*c); err != nil {
				t.Fatalf("Check: %v", err)
			}
			// Through a memo (as the BBS resolves): the same links, and a digest that is equal
			// for equal resolutions and different once a node changes.
			memo := NewMemo()
			m1, err1 := x.ResolveMemo(*c, tt.world.get, tt.cell, memo)
			m2, err2 := x.ResolveMemo(*c, tt.world.get, tt.cell, memo)
			if err1 != nil || err2 != nil || m1.Digest == "" || m1.Digest != m2.Digest {
				t.Fatalf("memo: %v %v, digests %q %q", err1, err2, m1.Digest, m2.Digest)
			}
			for name, w := range tt.want {
				if !proto.Equal(m1.Links[name], w) {
					t.Errorf("memo link %q:\n got %v\nwant %v", name, m1.Links[name], w)
				}
			}
			if len(tt.world) > 0 {
				moved := world{}
				for g, as := range tt.world {
					for _, a := range as {
						a = proto.Clone(a).(*modelsv1.ActualLRP)
						a.NetInfo.Address, a.NetInfo.InstanceAddress = "10.9.9.9", "10.9.9.10"
						moved[g] = append(moved[g], a)
					}
				}
				m3, _ := x.ResolveMemo(*c, moved.get, tt.cell, NewMemo())
				if m3.Digest == m1.Digest && len(got.Sources) > 0 && !tt.cellMisses {
					t.Errorf("digest unchanged after every provider instance moved: %q", m3.Digest)
				}
			}
		})
	}
}

func TestIndexUpdatesAndConsumers(t *testing.T) {
	x := IndexOf(
		lrp("mysql", "cf", nil, []*modelsv1.LinkProvide{provide("db", "db")}),
		lrp("web", "cf", nil, nil, &modelsv1.LinkConsume{Name: "db", Type: "db"}),
		lrp("worker", "cf", nil, nil, &modelsv1.LinkConsume{Name: "db", From: "db"}),
		lrp("plain", "cf", nil, nil),
	)
	if got := x.Consumers(); len(got) != 2 || got[0] != "web" || got[1] != "worker" {
		t.Fatalf("consumers %v", got)
	}
	if got := x.ConsumersOf("mysql"); len(got) != 2 {
		t.Fatalf("consumers of mysql %v, want web and worker", got)
	}
	x.Put(lrp("mysql-2", "cf", nil, []*modelsv1.LinkProvide{provide("db", "db", as("db2"))}))
	if err := x.Check(*x.LRP("web")); err == nil {
		t.Fatal("web resolves by type with two providers")
	}
	if got := x.ConsumersOf("mysql"); len(got) != 1 || got[0] != "worker" {
		t.Fatalf("consumers of mysql %v, want worker only (web is ambiguous now)", got)
	}
	x.Delete("mysql")
	x.Delete("mysql-2")
	if err := x.Check(*x.LRP("worker")); err == nil || err.Error() != "cannot resolve links of desired lrp \"worker\":\n  - link \"db\": no provider named \"db\" in domain \"cf\"" {
		t.Fatalf("worker after its provider left: %v", err)
	}
}

func TestMarshal(t *testing.T) {
	x := IndexOf(
		lrp("metron", "cf", []uint32{3457}, []*modelsv1.LinkProvide{provide("metron", "metron", port(3457))}),
		lrp("mysql", "cf", nil, []*modelsv1.LinkProvide{provide("db", "db", props("user", "u"))}),
		lrp("web", "cf", nil, nil,
			&modelsv1.LinkConsume{Name: "metron", Type: "metron", Colocated: true},
			&modelsv1.LinkConsume{Name: "db", Type: "db"}),
	)
	w := world{"metron": {inst("metron", 0, "cell-1", "z1", "10.0.0.44", 3457, 60100)}}
	res, err := x.Resolve(*x.LRP("web"), w.get, "cell-1")
	if err != nil {
		t.Fatal(err)
	}
	b, err := Marshal(*x.LRP("web"), res.Links, "cell-1")
	if err != nil {
		t.Fatal(err)
	}
	want := `{"db":{"nodes":[],"properties":{"user":"u"}},"metron":{"node":{"name":"metron","id":"metron-a","index":0,"az":"z1","address":"10.0.0.44:60100"},"properties":{}}}`
	if string(b) != want {
		t.Fatalf("json\n%s\nwant\n%s", b, want)
	}
	var back map[string]Document
	if err := json.Unmarshal(b, &back); err != nil || back["metron"].Node.Index != 0 || back["db"].Nodes == nil {
		t.Fatalf("round trip %v %+v", err, back)
	}
}

func TestAffected(t *testing.T) {
	x := IndexOf(
		lrp("web", "cf", nil, nil, &modelsv1.LinkConsume{Name: "db", Type: "db"}),
		lrp("worker", "cf", nil, nil, &modelsv1.LinkConsume{Name: "nats", From: "other.nats"}),
		lrp("batch", "jobs", nil, nil, &modelsv1.LinkConsume{Name: "db", Type: "db"}),
		lrp("mysql", "cf", nil, []*modelsv1.LinkProvide{provide("db", "db")}),
	)
	for _, tt := range []struct {
		changed LRP
		want    string
	}{
		{lrp("mysql", "cf", nil, []*modelsv1.LinkProvide{provide("db", "db")}), "web,worker"},
		{lrp("nats", "other", nil, []*modelsv1.LinkProvide{provide("nats", "nats")}), "worker"},
		{lrp("redis", "jobs", nil, []*modelsv1.LinkProvide{provide("cache", "redis")}), "batch,worker"},
		{*x.LRP("batch"), "batch"},
		{lrp("plain", "cf", nil, nil), ""},
	} {
		if got := strings.Join(x.Affected(tt.changed), ","); got != tt.want {
			t.Errorf("Affected(%s) = %q, want %q", tt.changed.Guid, got, tt.want)
		}
	}
}
