package api

import (
	"testing"

	"google.golang.org/protobuf/proto"
	"google.golang.org/protobuf/types/known/timestamppb"

	bbsv1 "github.com/gavel-sched/gavel/pkg/gen/gavel/bbs/v1"
	modelsv1 "github.com/gavel-sched/gavel/pkg/gen/gavel/models/v1"
)

// TestEncodedListIsTheList checks that a list answer built from encoded records, marshalled by
// the server's codec, decodes as the answer holding the decoded records, and that the codec
// marshals every other message as gRPC's own does.
func TestEncodedListIsTheList(t *testing.T) {
	records := []*modelsv1.ActualLRP{
		{Key: &modelsv1.ActualLRPKey{ProcessGuid: "web", Index: 0, Domain: "apps"}, State: modelsv1.ActualLRP_STATE_RUNNING,
			Presence: modelsv1.ActualLRP_PRESENCE_ORDINARY, InstanceKey: &modelsv1.ActualLRPInstanceKey{InstanceGuid: "i-0", CellId: "cell-a"},
			NetInfo: &modelsv1.ActualLRPNetInfo{Address: "10.0.0.1", Ports: []*modelsv1.PortMapping{{ContainerPort: 8080, HostPort: 61001}}},
			Since:   timestamppb.Now(), Routable: true},
		{Key: &modelsv1.ActualLRPKey{ProcessGuid: "web", Index: 1, Domain: "apps"}, State: modelsv1.ActualLRP_STATE_UNCLAIMED,
			Presence: modelsv1.ActualLRP_PRESENCE_ORDINARY},
	}
	for _, n := range []int{0, 1, 2} {
		var raw [][]byte
		for _, r := range records[:n] {
			b, err := proto.Marshal(r)
			if err != nil {
				t.Fatal(err)
			}
			raw = append(raw, b)
		}
		want := &bbsv1.ActualLRPsResponse{ActualLrps: records[:n], Revision: 42}
		for name, resp := range map[string]*bbsv1.ActualLRPsResponse{"encoded": actualLRPsResponse(raw, 42), "decoded": want} {
			data, err := Codec().Marshal(resp)
			if err != nil {
				t.Fatal(err)
			}
			got := &bbsv1.ActualLRPsResponse{}
			if err := proto.Unmarshal(data.Materialize(), got); err != nil {
				t.Fatalf("%d records, %s: %v", n, name, err)
			}
			if !proto.Equal(got, want) || len(got.ProtoReflect().GetUnknown()) != 0 {
				t.Fatalf("%d records, %s: decoded as %v, want %v", n, name, got, want)
			}
		}
	}
}
