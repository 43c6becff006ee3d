package main

import (
	"encoding/json"
	"fmt"
	"strings"

	"github.com/hashicorp/go-hclog"
	"github.com/spf13/cobra"

	"github.com/gavel-sched/gavel/pkg/backup"
	"github.com/gavel-sched/gavel/pkg/etcdx"
	"github.com/gavel-sched/gavel/pkg/tlsx"
	"github.com/gavel-sched/gavel/services/bbs"
	"github.com/gavel-sched/gavel/services/nsync"
)

// knownLayouts are the layout versions this release's services read and write.
func knownLayouts() map[string]int {
	return map[string]int{"bbs": bbs.LayoutVersion, "nsync": nsync.LayoutVersion}
}

// backupCommand is `gavel backup FILE`: an etcd snapshot with its manifest.
func (c *cli) backupCommand() *cobra.Command {
	var endpoints string
	var etcdTLS tlsx.Config
	cmd := &cobra.Command{
		Use:   "backup FILE",
		Short: "Back up Gavel's etcd store to FILE (an etcd snapshot with the layout versions, key labels and a checksum)",
		Long: `backup takes a snapshot of the etcd cluster through the client's maintenance API and
writes it to FILE (which must not exist) as a tar archive of manifest.json and snapshot.db. The
manifest names the layout version of the BBS's and nsync's records, the labels of the
encryption keys the sealed records need (keep those key files: the backup is unreadable
without them), the etcd revision and the snapshot's SHA-256. Restore it with gavel restore;
see docs/operations.md, "Back up and restore".`,
		Example: "  gavel backup --etcd-endpoints https://etcd-0:2379 --etcd-cert admin.crt --etcd-key admin.key --etcd-ca ca.crt gavel-$(date +%F).backup",
		Args:    cobra.ExactArgs(1),
		RunE: func(cmd *cobra.Command, args []string) error {
			// http:// endpoints are plaintext etcd; https:// ones take the --etcd-* files.
			etcdTLS.Insecure = !strings.Contains(endpoints, "https://")
			cli, err := etcdx.Connect(strings.Split(endpoints, ","), etcdTLS, hclog.NewNullLogger())
			if err != nil {
				return err
			}
			defer cli.Close()
			m, err := backup.Save(cmd.Context(), cli, args[0])
			if err != nil {
				return err
			}
			return c.printManifest("wrote", args[0], m)
		},
	}
	fs := cmd.Flags()
	fs.StringVar(&endpoints, "etcd-endpoints", "http://127.0.0.1:2379", "etcd client URLs, comma-separated")
	fs.StringVar(&etcdTLS.CertFile, "etcd-cert", "", "etcd client certificate (PEM)")
	fs.StringVar(&etcdTLS.KeyFile, "etcd-key", "", "etcd client key (PEM)")
	fs.StringVar(&etcdTLS.CAFile, "etcd-ca", "", "CA of the etcd members' certificates (PEM)")
	return cmd
}

// restoreCommand is `gavel restore FILE --data-dir DIR`: one etcd member's data directory.
func (c *cli) restoreCommand() *cobra.Command {
	var cfg backup.RestoreConfig
	var peerURLs string
	cmd := &cobra.Command{
		Use:   "restore FILE --data-dir DIR",
		Short: "Check a backup and write a new etcd member data directory from it",
		Long: `restore checks FILE — a complete archive, the snapshot's checksum, layout versions this
release knows — and refuses it, touching nothing, when any check fails. Then it writes DIR (which
must not exist) for one etcd member, with the revision moved 1,000,000,000 past the backup's and
the older revisions marked compacted, so that no client resumes a watch into the restored
history. For a cluster, run it once per member with that member's --name and --peer-urls and
the same --initial-cluster; start the members on their directories, then the BBSes and nsyncs
with the keys the manifest names. See docs/operations.md, "Back up and restore".`,
		Example: "  gavel restore gavel-2026-06-01.backup --data-dir /var/lib/etcd-restored --name etcd-0 \\\n" +
			"      --peer-urls https://etcd-0:2380 --initial-cluster etcd-0=https://etcd-0:2380,etcd-1=https://etcd-1:2380,etcd-2=https://etcd-2:2380",
		Args: cobra.ExactArgs(1),
		RunE: func(cmd *cobra.Command, args []string) error {
			if cfg.DataDir == "" {
				return usageErrorf("--data-dir is required")
			}
			if peerURLs != "" {
				cfg.PeerURLs = strings.Split(peerURLs, ",")
			}
			cfg.KnownLayouts = knownLayouts()
			m, err := backup.Restore(args[0], cfg)
			if err != nil {
				return err
			}
			return c.printManifest("restored into "+cfg.DataDir+" from", args[0], m)
		},
	}
	fs := cmd.Flags()
	fs.StringVar(&cfg.DataDir, "data-dir", "", "the member's new data directory (must not exist)")
	fs.StringVar(&cfg.Name, "name", "default", "the member's name")
	fs.StringVar(&peerURLs, "peer-urls", "http://localhost:2380", "the member's peer URLs, comma-separated")
	fs.StringVar(&cfg.InitialCluster, "initial-cluster", "", "name=peer-url,... of every member (default: this member alone)")
	fs.StringVar(&cfg.InitialClusterToken, "initial-cluster-token", "gavel-etcd", "the restored cluster's token")
	return cmd
}

// printManifest reports a backup's manifest: JSON with -o json, otherwise a few lines.
func (c *cli) printManifest(verb, file string, m backup.Manifest) error {
	if c.output == "json" {
		enc := json.NewEncoder(c.out)
		enc.SetIndent("", "  ")
		return enc.Encode(m)
	}
	labels := "none (no sealed record)"
	if len(m.KeyLabels) > 0 {
		labels = strings.Join(m.KeyLabels, ", ")
	}
	fmt.Fprintf(c.out, "%s %s: etcd revision %d, %d bytes, sha256 %s\n  layouts: bbs %d, nsync %d\n  encryption keys needed: %s\n",
		verb, file, m.Revision, m.SnapshotBytes, m.SnapshotSHA256, m.Layouts["bbs"], m.Layouts["nsync"], labels)
	return nil
}
