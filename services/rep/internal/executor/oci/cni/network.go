package cni

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"maps"
	"sync"

	"github.com/containernetworking/cni/libcni"
	types100 "github.com/containernetworking/cni/pkg/types/100"
)

// PortAllocator hands out host ports. The process backend's allocator (a range the rep is
// given, skipping ports in use on the host) has this shape.
type PortAllocator interface {
	// Acquire takes n host ports, all or none.
	Acquire(n int) ([]uint32, error)
	// Release gives ports back.
	Release(ports []uint32)
}

// PortMapping is one container port and the host port that reaches it.
type PortMapping struct {
	// ContainerPort is the port the process listens on inside the container.
	ContainerPort uint32
	// HostPort is the port on the cell's addresses that portmap forwards to it.
	HostPort uint32
}

// AttachRequest is what Attach networks.
type AttachRequest struct {
	// ContainerID names the attachment in libcni's cache, IPAM and iptables comments.
	ContainerID string
	// NetnsPath is the container's network namespace, e.g. /proc/PID/ns/net.
	NetnsPath string
	// Ports are the container ports (TCP), each mapped to its own host port.
	Ports []uint32
	// HostPorts, when not nil, are the host ports for Ports, index by index, chosen by the
	// caller (who keeps owning them). When nil, the Network's PortAllocator provides them
	// and Detach gives them back.
	HostPorts []uint32
	// Properties are the work's properties, handed to the plugins (see the package doc).
	Properties map[string]string
}

// Attachment is what Attach gave the container.
type Attachment struct {
	// IP is the container's IPv4 address: the instance address.
	IP string
	// Ports are the host port mappings, in the order of AttachRequest.Ports.
	Ports []PortMapping
	// HostInterface is the host side of the container's veth ("" when the plugins name none).
	HostInterface string
	// SkippedArgs are the property keys left out of CNI_ARGS (see CNIArgs); runtimeConfig
	// carries them.
	SkippedArgs []string
}

// Network attaches containers to one CNI network. It is safe for concurrent use.
type Network struct {
	cfg      Config
	cni      *libcni.CNIConfig
	list     *libcni.NetworkConfigList
	loopback *libcni.NetworkConfigList
	ports    PortAllocator

	turns chan struct{} // a slot per attachment or detachment running plugins (MaxParallel)

	mu    sync.Mutex
	owned map[string][]uint32 // container ID → host ports taken from ports
}

// portMapEntry is one element of the portMappings capability argument (the CNI conventions').
type portMapEntry struct {
	HostPort      uint32 `json:"hostPort"`
	ContainerPort uint32 `json:"containerPort"`
	Protocol      string `json:"protocol"`
}

// New validates cfg, loads its network and asks every plugin of it which CNI versions it
// speaks, so a missing or unsuitable plugin stops the rep at start-up. ports may be nil when
// every AttachRequest brings its HostPorts.
func New(ctx context.Context, cfg Config, ports PortAllocator) (*Network, error) {
	if err := cfg.Validate(); err != nil {
		return nil, err
	}
	list, src, err := cfg.load()
	if err != nil {
		return nil, err
	}
	lo, err := loopbackConfList(cfg.NetworkName)
	if err != nil {
		return nil, fmt.Errorf("cni: %w", err)
	}
	parallel := cfg.MaxParallel
	if parallel <= 0 {
		parallel = DefaultMaxParallel
	}
	n := &Network{
		cfg:      cfg,
		cni:      libcni.NewCNIConfigWithCacheDir(cfg.BinDirs, cfg.CacheDir, nil),
		list:     list,
		loopback: lo,
		ports:    ports,
		turns:    make(chan struct{}, parallel),
		owned:    map[string][]uint32{},
	}
	for _, l := range []*libcni.NetworkConfigList{list, lo} {
		if _, err := n.cni.ValidateNetworkList(ctx, l); err != nil {
			return nil, fmt.Errorf("cni: validate network %q (from %s): %w", l.Name, src, err)
		}
	}
	return n, nil
}

// turn waits until fewer than MaxParallel attachments and detachments run plugins; done
// ends the turn.
func (n *Network) turn(ctx context.Context) error {
	select {
	case n.turns <- struct{}{}:
		return nil
	case <-ctx.Done():
		return fmt.Errorf("waiting for a turn to run the plugins (%d at once): %w", cap(n.turns), context.Cause(ctx))
	}
}

// done ends a turn taken with turn.
func (n *Network) done() { <-n.turns }

// Name returns the network's name.
func (n *Network) Name() string { return n.list.Name }

// Attach networks the container in req.NetnsPath: loopback, then the network's chain with
// one host port per container port and the properties. On failure it deletes what the
// chain set up and gives back the host ports it took, and its error names the failing plugin.
func (n *Network) Attach(ctx context.Context, req AttachRequest) (Attachment, error) {
	if err := checkRequest(req); err != nil {
		return Attachment{}, fmt.Errorf("cni: attach %q: %w", req.ContainerID, err)
	}
	if err := n.turn(ctx); err != nil {
		return Attachment{}, fmt.Errorf("cni: attach %q: %w", req.ContainerID, err)
	}
	defer n.done()
	hostPorts := req.HostPorts
	if hostPorts == nil && len(req.Ports) > 0 {
		if n.ports == nil {
			return Attachment{}, fmt.Errorf("cni: attach %q: no host ports given and no allocator", req.ContainerID)
		}
		var err error
		if hostPorts, err = n.ports.Acquire(len(req.Ports)); err != nil {
			return Attachment{}, fmt.Errorf("cni: attach %q: %w", req.ContainerID, err)
		}
		n.mu.Lock()
		n.owned[req.ContainerID] = hostPorts
		n.mu.Unlock()
	}
	var att Attachment
	for i, p := range req.Ports {
		att.Ports = append(att.Ports, PortMapping{ContainerPort: p, HostPort: hostPorts[i]})
	}
	rt := n.runtimeConf(req.ContainerID, req.NetnsPath, att.Ports)
	rt.Args, att.SkippedArgs = CNIArgs(req.Properties)
	rt.CapabilityArgs[PropertiesCapability] = maps.Clone(req.Properties)
	if req.Properties == nil {
		rt.CapabilityArgs[PropertiesCapability] = map[string]string{}
	}

	fail := func(stage string, err error) (Attachment, error) {
		err = fmt.Errorf("cni: attach %q to network %q: %s: %w", req.ContainerID, n.list.Name, stage, err)
		if derr := n.del(context.WithoutCancel(ctx), rt); derr != nil {
			err = fmt.Errorf("%w (cleaning up: %w)", err, derr)
		}
		n.release(req.ContainerID)
		return Attachment{}, err
	}
	if _, err := n.cni.AddNetworkList(ctx, n.loopback, n.loopbackConf(rt)); err != nil {
		return fail("loopback", err)
	}
	res, err := n.cni.AddNetworkList(ctx, n.list, rt)
	if err != nil {
		return fail("add", err)
	}
	r, err := types100.NewResultFromResult(res)
	if err != nil {
		return fail("read result", err)
	}
	for _, ip := range r.IPs {
		if v4 := ip.Address.IP.To4(); v4 != nil {
			att.IP = v4.String()
			break
		}
	}
	if att.IP == "" {
		return fail("read result", fmt.Errorf("no IPv4 address in the result of network %q", n.list.Name))
	}
	att.HostInterface = hostInterface(r)
	return att, nil
}

// Detach deletes the container's attachment: the chain's DEL, with the configuration and
// arguments cached at ADD time, then loopback's. ports (what Attach returned) are used only
// when libcni's cache of the attachment is gone (portmap deletes nothing without them); nil
// is fine otherwise. Detaching twice, or a container never attached, is not an error. Host
// ports taken from the PortAllocator are given back.
func (n *Network) Detach(ctx context.Context, containerID, netnsPath string, ports []PortMapping) error {
	if containerID == "" {
		return errors.New("cni: detach: empty container ID")
	}
	if err := n.turn(ctx); err != nil {
		return fmt.Errorf("cni: detach %q: %w", containerID, err)
	}
	defer n.done()
	err := n.del(ctx, n.runtimeConf(containerID, netnsPath, ports))
	n.release(containerID)
	if err != nil {
		return fmt.Errorf("cni: detach %q from network %q: %w", containerID, n.list.Name, err)
	}
	return nil
}

// Attached returns the attachment libcni cached for containerID when it was attached (what a
// restarted rep needs to adopt a running container: its address and host ports); ok is false
// when the container is not attached. Host ports of an adopted container are the caller's:
// reserve them in the allocator and pass them to Detach.
func (n *Network) Attached(containerID, netnsPath string) (att Attachment, ok bool, err error) {
	rt := n.runtimeConf(containerID, netnsPath, nil)
	_, cached, err := n.cni.GetNetworkListCachedConfig(n.list, rt)
	if err != nil {
		return Attachment{}, false, fmt.Errorf("cni: attachment of %q: %w", containerID, err)
	}
	if cached == nil {
		return Attachment{}, false, nil
	}
	res, err := n.cni.GetNetworkListCachedResult(n.list, rt)
	if err == nil && res == nil {
		err = errors.New("no cached result")
	}
	var r *types100.Result
	if err == nil {
		r, err = types100.NewResultFromResult(res)
	}
	if err != nil {
		return Attachment{}, false, fmt.Errorf("cni: attachment of %q: %w", containerID, err)
	}
	for _, ip := range r.IPs {
		if v4 := ip.Address.IP.To4(); v4 != nil {
			att.IP = v4.String()
			break
		}
	}
	att.HostInterface = hostInterface(r)
	// The capability arguments come back from the cache's JSON as plain maps and slices.
	var pm []portMapEntry
	var props map[string]string
	if err := remarshal(cached.CapabilityArgs["portMappings"], &pm); err != nil {
		return Attachment{}, false, fmt.Errorf("cni: attachment of %q: cached portMappings: %w", containerID, err)
	}
	if err := remarshal(cached.CapabilityArgs[PropertiesCapability], &props); err != nil {
		return Attachment{}, false, fmt.Errorf("cni: attachment of %q: cached properties: %w", containerID, err)
	}
	for _, p := range pm {
		att.Ports = append(att.Ports, PortMapping{ContainerPort: p.ContainerPort, HostPort: p.HostPort})
	}
	_, att.SkippedArgs = CNIArgs(props)
	return att, true, nil
}

// PortReserver is a PortAllocator that can take given ports out of its free list (the
// hostports allocator); Adopt uses it to keep an adopted container's host ports from being
// handed out again.
type PortReserver interface {
	// Reserve takes ports out of the free list; ports not in the free list are ignored.
	Reserve(ports []uint32)
}

// Adopt is Attached for a container a restarted rep takes over: its host ports are reserved
// in the Network's PortAllocator (when it is a PortReserver) and owned as if Attach had taken
// them, so Detach gives them back.
func (n *Network) Adopt(containerID, netnsPath string) (Attachment, bool, error) {
	att, ok, err := n.Attached(containerID, netnsPath)
	if err != nil || !ok || len(att.Ports) == 0 {
		return att, ok, err
	}
	ports := make([]uint32, len(att.Ports))
	for i, p := range att.Ports {
		ports[i] = p.HostPort
	}
	if r, can := n.ports.(PortReserver); can {
		r.Reserve(ports)
		n.mu.Lock()
		n.owned[containerID] = ports
		n.mu.Unlock()
	}
	return att, true, nil
}

// remarshal decodes v, a value decoded from JSON into any, into out.
func remarshal(v, out any) error {
	if v == nil {
		return nil
	}
	b, err := json.Marshal(v)
	if err != nil {
		return err
	}
	return json.Unmarshal(b, out)
}

// del runs DEL for the chain and loopback, preferring what libcni cached at ADD time.
func (n *Network) del(ctx context.Context, rt *libcni.RuntimeConf) error {
	list := n.list
	conf, cached, err := n.cni.GetNetworkListCachedConfig(n.list, rt)
	if err != nil {
		return fmt.Errorf("read cached attachment: %w", err)
	}
	if conf != nil && cached != nil {
		if l, err := libcni.ConfListFromBytes(conf); err == nil {
			list, rt = l, cached
		}
	}
	var errs []error
	if err := n.cni.DelNetworkList(ctx, list, rt); err != nil {
		errs = append(errs, n.delEach(ctx, list, rt)...)
	}
	if err := n.cni.DelNetworkList(ctx, n.loopback, n.loopbackConf(rt)); err != nil {
		errs = append(errs, fmt.Errorf("loopback: %w", err))
	}
	return errors.Join(errs...)
}

// delEach runs DEL plugin by plugin, last first, going on past failures: DelNetworkList
// stops at the first, which would leave the earlier plugins' veth, address and rules behind
// when a later plugin is missing or failing.
func (n *Network) delEach(ctx context.Context, list *libcni.NetworkConfigList, rt *libcni.RuntimeConf) []error {
	var errs []error
	for i := len(list.Plugins) - 1; i >= 0; i-- {
		p := list.Plugins[i]
		pc, err := libcni.InjectConf(p, map[string]any{"name": list.Name, "cniVersion": list.CNIVersion})
		if err == nil {
			err = n.cni.DelNetwork(ctx, pc, rt)
		}
		if err != nil {
			errs = append(errs, fmt.Errorf("plugin type=%q failed (delete): %w", p.Network.Type, err))
		}
	}
	return errs
}

// runtimeConf is the RuntimeConf of the chain, with portMappings when there are ports.
func (n *Network) runtimeConf(containerID, netnsPath string, ports []PortMapping) *libcni.RuntimeConf {
	rt := &libcni.RuntimeConf{
		ContainerID:    containerID,
		NetNS:          netnsPath,
		IfName:         n.cfg.IfName,
		CacheDir:       n.cfg.CacheDir,
		CapabilityArgs: map[string]any{},
	}
	if len(ports) > 0 {
		pm := make([]portMapEntry, len(ports))
		for i, p := range ports {
			pm[i] = portMapEntry{HostPort: p.HostPort, ContainerPort: p.ContainerPort, Protocol: "tcp"}
		}
		rt.CapabilityArgs["portMappings"] = pm
	}
	return rt
}

// loopbackConf is rt for the loopback network: interface "lo", no arguments.
func (n *Network) loopbackConf(rt *libcni.RuntimeConf) *libcni.RuntimeConf {
	return &libcni.RuntimeConf{ContainerID: rt.ContainerID, NetNS: rt.NetNS, IfName: "lo", CacheDir: rt.CacheDir}
}

// release gives back the host ports Attach took for containerID.
func (n *Network) release(containerID string) {
	n.mu.Lock()
	ports, ok := n.owned[containerID]
	delete(n.owned, containerID)
	n.mu.Unlock()
	if ok && n.ports != nil {
		n.ports.Release(ports)
	}
}

// checkRequest reports what is wrong with req.
func checkRequest(req AttachRequest) error {
	if req.ContainerID == "" {
		return errors.New("empty container ID")
	}
	if req.NetnsPath == "" {
		return errors.New("empty network namespace path")
	}
	if req.HostPorts != nil && len(req.HostPorts) != len(req.Ports) {
		return fmt.Errorf("%d host ports for %d container ports", len(req.HostPorts), len(req.Ports))
	}
	seen := map[uint32]bool{}
	for _, p := range req.Ports {
		if p == 0 || p > 65535 {
			return fmt.Errorf("container port %d out of range 1-65535", p)
		}
		if seen[p] {
			return fmt.Errorf("container port %d given twice", p)
		}
		seen[p] = true
	}
	for _, p := range req.HostPorts {
		if p == 0 || p > 65535 {
			return fmt.Errorf("host port %d out of range 1-65535", p)
		}
	}
	return nil
}

// hostInterface returns the host side of the container's veth: the last interface of the
// result outside any sandbox (bridge lists the bridge, then the host veth).
func hostInterface(r *types100.Result) string {
	name := ""
	for _, i := range r.Interfaces {
		if i.Sandbox == "" {
			name = i.Name
		}
	}
	return name
}
