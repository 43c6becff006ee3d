package store

import (
	"testing"

	"github.com/gavel-sched/gavel/pkg/etcdx"
	modelsv1 "github.com/gavel-sched/gavel/pkg/gen/gavel/models/v1"
)

// TestKeysRoundTrip checks that every key the BBS builds parses back to the record it names,
// that election keys (etcdx) are recognised and ignored, and that anything else is refused.
func TestKeysRoundTrip(t *testing.T) {
	for _, tt := range []struct {
		key  string
		want parsedKey
	}{
		{DesiredSchedKey("web"), parsedKey{kind: kindSched, id: "web"}},
		{DesiredRunKey("web"), parsedKey{kind: kindRun, id: "web"}},
		{ActualKey("web", 3, modelsv1.ActualLRP_PRESENCE_ORDINARY), parsedKey{kind: kindActual, id: "web", index: 3, presence: modelsv1.ActualLRP_PRESENCE_ORDINARY}},
		{ActualKey("web", 0, modelsv1.ActualLRP_PRESENCE_EVACUATING), parsedKey{kind: kindActual, id: "web", presence: modelsv1.ActualLRP_PRESENCE_EVACUATING}},
		{ActualKey("web", 7, modelsv1.ActualLRP_PRESENCE_SUSPECT), parsedKey{kind: kindActual, id: "web", index: 7, presence: modelsv1.ActualLRP_PRESENCE_SUSPECT}},
		{ActualKey("web", 1234, modelsv1.ActualLRP_PRESENCE_ORDINARY), parsedKey{kind: kindActual, id: "web", index: 1234, presence: modelsv1.ActualLRP_PRESENCE_ORDINARY}},
		{TaskKey("t1"), parsedKey{kind: kindTask, id: "t1"}},
		{DomainKey("cf-apps"), parsedKey{kind: kindDomain, id: "cf-apps"}},
		{CellKey("cell-1"), parsedKey{kind: kindCell, id: "cell-1"}},
	} {
		got, err := parseKey(tt.key)
		if err != nil || got != tt.want {
			t.Errorf("parseKey(%q) = %+v, %v; want %+v", tt.key, got, err, tt.want)
		}
		if got.String() != tt.key {
			t.Errorf("parseKey(%q).String() = %q", tt.key, got.String())
		}
	}
	if got, err := parseKey(etcdx.LockKey("bbs") + "/694d7a"); err != nil || got.kind != kindUnknown {
		t.Errorf("election key: %+v, %v; want it recognised and ignored", got, err)
	}
	for _, bad := range []string{Root + "actual/web/x/ordinary", Root + "actual/web/1/other",
		Root + "actual/web/1/ordinary/x", Root + "actual//1/ordinary", Root + "actual/web/1", Root + "actual/web", Root + "task/", Root + "task/a/b", Root + "other/x"} {
		if _, err := parseKey(bad); err == nil {
			t.Errorf("parseKey(%q) accepted", bad)
		}
	}
}
