package nsync_test

import (
	"context"
	"path/filepath"
	"strings"
	"testing"

	"google.golang.org/grpc"
	"google.golang.org/grpc/credentials/insecure"

	"github.com/gavel-sched/gavel/internal/testkit"
	"github.com/gavel-sched/gavel/pkg/etcdx/etcdtest"
	bbsv1 "github.com/gavel-sched/gavel/pkg/gen/gavel/bbs/v1"
	nsyncv1 "github.com/gavel-sched/gavel/pkg/gen/gavel/nsync/v1"
	"github.com/gavel-sched/gavel/pkg/layout"
	"github.com/gavel-sched/gavel/pkg/logging/logtest"
	"github.com/gavel-sched/gavel/pkg/sealing"
	"github.com/gavel-sched/gavel/pkg/tlsx"
	"github.com/gavel-sched/gavel/services/nsync"
	"github.com/gavel-sched/gavel/services/nsync/internal/store"
)

// TestEncryptionMissingKeyRefusesToStart: an nsync whose keyring lacks the key an app record is
// sealed under stops before it serves, naming the label; so does one with encryption off.
func TestEncryptionMissingKeyRefusesToStart(t *testing.T) {
	_, cli := etcdtest.Start(t)
	dir := t.TempDir()
	keyFile := func(label string) sealing.KeyFile {
		path := filepath.Join(dir, label+".key")
		if err := sealing.WriteKeyFile(path); err != nil {
			t.Fatal(err)
		}
		return sealing.KeyFile{Label: label, File: path}
	}
	k1, k2 := keyFile("k1"), keyFile("k2")
	kr, err := sealing.Config{ActiveKeyLabel: "k1", Keys: []sealing.KeyFile{k1}}.Keyring()
	if err != nil {
		t.Fatal(err)
	}
	if _, err := store.New(cli, kr).CreateApp(context.Background(), &nsyncv1.AppRecord{App: &nsyncv1.App{Guid: "a1", Env: map[string]string{"K": "v"}}}); err != nil {
		t.Fatal(err)
	}
	// Never dialled: nsync stops before it calls the BBS.
	conn, err := grpc.NewClient("127.0.0.1:1", grpc.WithTransportCredentials(insecure.NewCredentials()))
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = conn.Close() })
	for _, tc := range []struct {
		name string
		enc  sealing.Config
	}{
		{"old key removed", sealing.Config{ActiveKeyLabel: "k2", Keys: []sealing.KeyFile{k2}}},
		{"encryption off", sealing.Config{}},
	} {
		t.Run(tc.name, func(t *testing.T) {
			cfg := nsync.Default()
			cfg.ListenAddress = "127.0.0.1:0"
			cfg.TLS, cfg.BBSTLS, cfg.EtcdTLS = tlsx.Config{Insecure: true}, tlsx.Config{Insecure: true}, tlsx.Config{Insecure: true}
			cfg.Encryption = tc.enc
			svc, err := nsync.New(cfg, logtest.New(t), cli, bbsv1.NewBBSServiceClient(conn))
			if err != nil {
				t.Fatal(err)
			}
			ctx, cancel := context.WithTimeout(context.Background(), testkit.ReadyTimeout)
			defer cancel()
			err = svc.Run(ctx, func() { t.Error("nsync served with an app record it cannot open") })
			if err == nil || !strings.Contains(err.Error(), `key label "k1"`) || !strings.Contains(err.Error(), "/gavel/v1/nsync/app/a1") {
				t.Fatalf("Run = %v, want a refusal naming key label k1 and the record", err)
			}
		})
	}
}

// TestLayoutUpgradeSealsClearApps: an app record stored clear by a release before layout
// versioning (no layout key) is sealed by nsync's migration before nsync serves, and the
// layout key moves to 2; an nsync older than the store refuses it, naming both versions.
func TestLayoutUpgradeSealsClearApps(t *testing.T) {
	_, cli := etcdtest.Start(t)
	path := filepath.Join(t.TempDir(), "k1.key")
	if err := sealing.WriteKeyFile(path); err != nil {
		t.Fatal(err)
	}
	enc := sealing.Config{ActiveKeyLabel: "k1", Keys: []sealing.KeyFile{{Label: "k1", File: path}}}
	if _, err := store.New(cli, nil).CreateApp(context.Background(), &nsyncv1.AppRecord{App: &nsyncv1.App{Guid: "a1", Env: map[string]string{"K": "s3cret"}}}); err != nil {
		t.Fatal(err)
	}
	conn, err := grpc.NewClient("127.0.0.1:1", grpc.WithTransportCredentials(insecure.NewCredentials()))
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = conn.Close() })
	run := func(t *testing.T, ready func()) error {
		cfg := nsync.Default()
		cfg.ListenAddress = "127.0.0.1:0"
		cfg.TLS, cfg.BBSTLS, cfg.EtcdTLS = tlsx.Config{Insecure: true}, tlsx.Config{Insecure: true}, tlsx.Config{Insecure: true}
		cfg.Encryption = enc
		svc, err := nsync.New(cfg, logtest.New(t), cli, bbsv1.NewBBSServiceClient(conn))
		if err != nil {
			t.Fatal(err)
		}
		ctx, cancel := context.WithTimeout(context.Background(), testkit.ReadyTimeout)
		defer cancel()
		return svc.Run(ctx, func() { ready(); cancel() })
	}
	var sealedAtReady bool
	if err := run(t, func() {
		resp, err := cli.Get(context.Background(), "/gavel/v1/nsync/app/a1")
		if err != nil {
			t.Error(err)
			return
		}
		label, sealed, _ := sealing.LabelOf(resp.Kvs[0].Value)
		sealedAtReady = sealed && label == "k1"
	}); err != nil {
		t.Fatal(err)
	}
	if !sealedAtReady {
		t.Error("the clear app record was not sealed before nsync served")
	}
	if s, _, err := layout.Read(context.Background(), cli, store.LayoutService); err != nil || s != (layout.State{Version: store.LayoutVersion}) {
		t.Errorf("layout %+v (%v), want version %d", s, err, store.LayoutVersion)
	}

	if _, err := cli.Put(context.Background(), layout.Key(store.LayoutService), `{"version":3}`); err != nil {
		t.Fatal(err)
	}
	err = run(t, func() { t.Error("an nsync older than the store served") })
	if err == nil || !strings.Contains(err.Error(), "nsync layout is version 3, newer than this nsync's version 2") {
		t.Fatalf("Run = %v, want a refusal naming versions 3 and 2", err)
	}
}
