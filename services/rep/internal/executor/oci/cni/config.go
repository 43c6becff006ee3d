package cni

import (
	"encoding/json"
	"errors"
	"fmt"
	"net"
	"strings"

	"github.com/containernetworking/cni/libcni"
	"github.com/containernetworking/cni/pkg/invoke"
)

// CNIVersion is the CNI spec version of the generated configurations: the newest that
// Debian 12's containernetworking-plugins (1.1.1) speak.
const CNIVersion = "1.0.0"

// InstallHint says how to get the reference plugins; errors about missing plugins end with it.
const InstallHint = "install Debian's containernetworking-plugins (apt-get install containernetworking-plugins)"

// Config says where the CNI configuration and plugins are and what the default network is.
type Config struct {
	// ConfDir holds the operator's network configurations (.conflist, .conf, .json). The one
	// whose "name" is NetworkName is used; when there is none, the default chain is generated
	// from Bridge, Subnet and IPAMDataDir.
	ConfDir string
	// BinDirs are searched, in order, for plugin executables.
	BinDirs []string
	// NetworkName is the network's name: the configuration looked for in ConfDir and the name
	// of the generated one.
	NetworkName string
	// Bridge is the cell bridge of the generated chain (at most 15 bytes).
	Bridge string
	// Subnet is the IPv4 CIDR host-local hands container addresses out of in the generated
	// chain. It exists only inside this host (the bridge masquerades outgoing traffic).
	Subnet string
	// IPAMDataDir is where host-local records allocations in the generated chain ("" keeps
	// host-local's default, /var/lib/cni/networks).
	IPAMDataDir string
	// CacheDir is where libcni caches each attachment's configuration and result, which
	// Detach uses.
	CacheDir string
	// IfName is the container's interface name.
	IfName string
	// MaxParallel bounds the attachments and detachments that run their plugins at once
	// (DefaultMaxParallel when zero or less).
	MaxParallel int
}

// DefaultMaxParallel is how many containers a Network attaches or detaches at once unless
// told otherwise. bridge and portmap change iptables under one host-wide lock, and every
// iptables call reads the whole ruleset, so a cell starting 100 containers at once with no
// bound ran 100 plugin chains into that lock: on a 2-core machine some portmap ADDs took more
// than the 30 s a start may take and were killed. A few at a time keep the lock busy without
// the pile-up.
const DefaultMaxParallel = 4

// Default returns the configuration a rep uses unless told otherwise.
func Default() Config {
	return Config{
		ConfDir:     "/etc/cni/net.d",
		BinDirs:     []string{"/usr/lib/cni", "/opt/cni/bin"},
		NetworkName: "gavel",
		Bridge:      "gavel0",
		Subnet:      "10.255.0.0/16",
		CacheDir:    libcni.CacheDir,
		IfName:      "eth0",
		MaxParallel: DefaultMaxParallel,
	}
}

// Validate reports what is wrong with c: empty fields, a bad subnet or bridge name, a
// configuration in ConfDir that does not parse, and any plugin of the network (or the
// loopback plugin) that is not in BinDirs.
func (c Config) Validate() error {
	var errs []error
	if c.NetworkName == "" {
		errs = append(errs, errors.New("network name is empty"))
	}
	if len(c.BinDirs) == 0 {
		errs = append(errs, errors.New("no plugin directories"))
	}
	if c.IfName == "" {
		errs = append(errs, errors.New("interface name is empty"))
	}
	if c.CacheDir == "" {
		errs = append(errs, errors.New("cache directory is empty"))
	}
	if len(errs) > 0 {
		return fmt.Errorf("cni config: %w", errors.Join(errs...))
	}
	list, src, err := c.load()
	if err != nil {
		return err
	}
	types := []string{"loopback"}
	for _, p := range list.Plugins {
		types = append(types, p.Network.Type)
	}
	for _, typ := range types {
		if _, err := invoke.FindInPath(typ, c.BinDirs); err != nil {
			errs = append(errs, fmt.Errorf("plugin %q (network %q from %s) not found in %s",
				typ, list.Name, src, strings.Join(c.BinDirs, ":")))
		}
	}
	if len(errs) > 0 {
		return fmt.Errorf("cni config: %w; %s", errors.Join(errs...), InstallHint)
	}
	return nil
}

// load returns the network list and where it came from (a file, or "the generated default").
func (c Config) load() (*libcni.NetworkConfigList, string, error) {
	list, err := libcni.LoadConfList(c.ConfDir, c.NetworkName)
	var notFound libcni.NotFoundError
	var none libcni.NoConfigsFoundError
	switch {
	case err == nil:
		return list, fmt.Sprintf("a configuration in %s", c.ConfDir), nil
	case errors.As(err, &notFound), errors.As(err, &none):
	default:
		return nil, "", fmt.Errorf("cni config: load network %q from %s: %w", c.NetworkName, c.ConfDir, err)
	}
	b, err := DefaultConfList(c)
	if err != nil {
		return nil, "", err
	}
	list, err = libcni.ConfListFromBytes(b)
	if err != nil {
		return nil, "", fmt.Errorf("cni config: parse generated network %q: %w", c.NetworkName, err)
	}
	return list, "the generated default", nil
}

// DefaultConfList returns the generated chain for c: a bridge (c.Bridge, the containers'
// gateway, masquerading their outgoing traffic) with host-local IPAM on c.Subnet, then
// portmap (capability portMappings, with SNAT so 127.0.0.1:hostPort reaches the container).
func DefaultConfList(c Config) ([]byte, error) {
	_, subnet, err := net.ParseCIDR(c.Subnet)
	if err != nil || subnet.IP.To4() == nil {
		return nil, fmt.Errorf("cni config: subnet %q is not an IPv4 CIDR", c.Subnet)
	}
	if ones, _ := subnet.Mask.Size(); ones > 30 {
		return nil, fmt.Errorf("cni config: subnet %s has room for no container (at most /30)", subnet)
	}
	if c.Bridge == "" || len(c.Bridge) > 15 || strings.ContainsAny(c.Bridge, "/ \t\n:") {
		return nil, fmt.Errorf("cni config: bridge name %q is not a Linux interface name (1-15 bytes, no '/', ':' or space)", c.Bridge)
	}
	ipam := map[string]any{
		"type":   "host-local",
		"ranges": [][]map[string]string{{{"subnet": subnet.String()}}},
		"routes": []map[string]string{{"dst": "0.0.0.0/0"}},
	}
	if c.IPAMDataDir != "" {
		ipam["dataDir"] = c.IPAMDataDir
	}
	conf := map[string]any{
		"cniVersion": CNIVersion,
		"name":       c.NetworkName,
		"plugins": []map[string]any{
			{
				"type":        "bridge",
				"bridge":      c.Bridge,
				"isGateway":   true,
				"ipMasq":      true,
				"hairpinMode": true,
				"ipam":        ipam,
			},
			{
				"type":         "portmap",
				"capabilities": map[string]bool{"portMappings": true},
				"snat":         true,
			},
		},
	}
	b, err := json.Marshal(conf)
	if err != nil {
		return nil, fmt.Errorf("cni config: encode generated network %q: %w", c.NetworkName, err)
	}
	return b, nil
}

// loopbackConfList is the network that brings up "lo" in every container.
func loopbackConfList(network string) (*libcni.NetworkConfigList, error) {
	b, err := json.Marshal(map[string]any{
		"cniVersion": CNIVersion,
		"name":       network + "-loopback",
		"plugins":    []map[string]string{{"type": "loopback"}},
	})
	if err != nil {
		return nil, fmt.Errorf("encode loopback network: %w", err)
	}
	list, err := libcni.ConfListFromBytes(b)
	if err != nil {
		return nil, fmt.Errorf("parse loopback network: %w", err)
	}
	return list, nil
}
