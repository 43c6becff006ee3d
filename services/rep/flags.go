package rep

import (
	"flag"
	"strconv"

	"github.com/gavel-sched/gavel/pkg/bbsclient"
	"github.com/gavel-sched/gavel/pkg/config"
	"github.com/gavel-sched/gavel/pkg/serviceconfig"
)

// Flags binds the rep's command-line flags to c: the shared ones (serviceconfig: -listen, the
// server TLS flags, -metrics-address, -log-level, -log-format; -etcd-endpoints and the etcd
// TLS flags), the BBS client's (bbsclient.Flags) and the cell's own.
func (c *Config) Flags(fs *flag.FlagSet) {
	serviceconfig.BaseFlags(fs, &c.Base, "server")
	serviceconfig.EtcdFlags(fs, &c.Etcd)
	bbsclient.Flags(fs, &c.Config)
	fs.StringVar(&c.CellID, "cell-id", c.CellID, "cell id")
	fs.StringVar(&c.Zone, "zone", c.Zone, "availability zone")
	fs.Var(config.List{Values: &c.Tags}, "tags", "comma-separated placement tags (case-insensitive)")
	fs.Var(config.JSONMap{Values: &c.PreloadedRootfses}, "preloaded-rootfses", `preloaded rootfses as JSON name→path, e.g. '{"cflinuxfs4":"/path"}'`)
	fs.Var(config.List{Values: &c.SupportedRootfsProviders}, "supported-root-fs-providers", "comma-separated rootfs providers, e.g. docker")
	fs.Var(int32Flag{&c.Capacity.MemoryMB}, "memory-mb", "memory capacity in MiB")
	fs.Var(int32Flag{&c.Capacity.DiskMB}, "disk-mb", "disk capacity in MiB")
	fs.Var(int32Flag{&c.Capacity.Containers}, "containers", "container capacity")
	fs.StringVar(&c.Backend, "backend", c.Backend, "executor backend: process|oci|sim")
	fs.StringVar(&c.AdvertiseAddress, "advertise-address", c.AdvertiseAddress, "rep address registered in the cell presence (default: the bound listen address)")
	fs.StringVar(&c.CellAddress, "cell-address", c.CellAddress, "address instances are reached on")
	fs.Var(&c.LeaseTTL, "lease-ttl", "TTL of the cell presence's lease")
	fs.StringVar(&c.PortRange, "port-range", c.PortRange, "host port range, start-end")
	fs.StringVar(&c.WorkDir, "work-dir", c.WorkDir, "directory for containers and the rootfs cache")
	fs.StringVar(&c.RunAsUser, "run-as-user", c.RunAsUser, "unprivileged user processes drop to")
	fs.BoolVar(&c.ChrootPreloaded, "chroot-preloaded", c.ChrootPreloaded, "run processes of preloaded rootfses chrooted into their directory")
	fs.BoolVar(&c.InsecureRegistries, "insecure-registries", c.InsecureRegistries, "let the docker rootfs provider talk plain HTTP to registries (development only)")
	fs.Var(config.List{Values: &c.Hooks.OnCreate}, "on-create-hooks", "comma-separated executables run before a container starts (spec JSON on stdin)")
	fs.Var(config.List{Values: &c.Hooks.OnDestroy}, "on-destroy-hooks", "comma-separated executables run after a container stopped (spec JSON on stdin)")
	fs.Var(&c.Sim.StartLatency, "sim-start-latency", "sim backend: time to become healthy")
	fs.Float64Var(&c.Sim.CrashRate, "sim-crash-rate", c.Sim.CrashRate, "sim backend: crash probability per second")
	fs.IntVar(&c.Sim.Cells, "sim-cells", c.Sim.Cells, "sim backend: run this many simulated cells in this process, cell-id-0000 on (scale runs; listen on host:0, {cell} in certificate paths)")
	fs.Var(&c.Sim.LogInterval, "sim-log-interval", "sim backend: time between two synthetic log lines of a container (0: none)")
	fs.Var(&c.Metrics.SampleInterval, "metrics-sample-interval", "how often every container's CPU, memory and disk use is measured (at least 100ms)")
	fs.Int64Var(&c.Logs.MaxFileBytes, "log-max-file-bytes", c.Logs.MaxFileBytes, "bound of each of a container's two log files on the cell")
	fs.Var(&c.Logs.Retention, "log-retention", "how long the logs of a container the cell no longer holds are kept")
	fs.StringVar(&c.Logs.DrainCAFile, "log-drain-ca", c.Logs.DrainCAFile, "PEM file of the CAs syslog-tls drains are verified against (default: the system roots)")
	fs.StringVar(&c.OCI.ContainerdSocket, "containerd-socket", c.OCI.ContainerdSocket, "oci backend: containerd's socket")
	fs.StringVar(&c.OCI.Namespace, "containerd-namespace", c.OCI.Namespace, "oci backend: containerd namespace of the cell's containers")
	fs.StringVar(&c.OCI.Runtime, "containerd-runtime", c.OCI.Runtime, "oci backend: containerd runtime")
	fs.StringVar(&c.OCI.CNIConfDir, "cni-conf-dir", c.OCI.CNIConfDir, "oci backend: CNI network configuration directory; containers get their own address and host ports (empty: loopback only)")
	fs.StringVar(&c.OCI.CNIBinDir, "cni-bin-dir", c.OCI.CNIBinDir, "oci backend: CNI plugin directory")
	fs.StringVar(&c.OCI.Snapshotter, "containerd-snapshotter", c.OCI.Snapshotter, "oci backend: containerd snapshotter for docker:// images (empty: overlayfs)")
	fs.Var(&c.OCI.ImageGCUnusedFor, "containerd-image-gc-unused-for", "oci backend: how long a pulled docker:// image no container uses is kept before it is removed (0: for ever)")
	fs.Var(&c.BulkInterval, "bulk-interval", "how often containers are reconciled with the BBS")
	fs.Var(&c.EvacuationTimeout, "evacuation-timeout", "bound of an evacuation")
}

// int32Flag is an int32 flag.
type int32Flag struct{ v *int32 }

// String implements flag.Value.
func (f int32Flag) String() string {
	if f.v == nil {
		return "0"
	}
	return strconv.Itoa(int(*f.v))
}

// Set implements flag.Value.
func (f int32Flag) Set(s string) error {
	n, err := strconv.ParseInt(s, 10, 32)
	if err != nil {
		return err
	}
	*f.v = int32(n)
	return nil
}
