package models

import (
	"testing"

	"google.golang.org/protobuf/proto"
	"google.golang.org/protobuf/types/known/timestamppb"

	modelsv1 "github.com/gavel-sched/gavel/pkg/gen/gavel/models/v1"
)

// cloneSample is an ActualLRP with every kind of field set: nested messages, repeated
// messages, a timestamp (a message of another package).
func cloneSample() *modelsv1.ActualLRP {
	return &modelsv1.ActualLRP{
		Key:         &modelsv1.ActualLRPKey{ProcessGuid: "web", Index: 3, Domain: "apps"},
		InstanceKey: &modelsv1.ActualLRPInstanceKey{InstanceGuid: "ig-1", CellId: "cell-7"},
		NetInfo: &modelsv1.ActualLRPNetInfo{Address: "10.0.0.7", InstanceAddress: "10.255.0.9",
			Ports: []*modelsv1.PortMapping{{ContainerPort: 8080, HostPort: 61001}, {ContainerPort: 2222, HostPort: 61002}}},
		State:           modelsv1.ActualLRP_STATE_RUNNING,
		Presence:        modelsv1.ActualLRP_PRESENCE_ORDINARY,
		Since:           timestamppb.Now(),
		ModificationTag: &modelsv1.ModificationTag{Epoch: "e", Index: 9},
		Zone:            "z1",
	}
}

// TestCloneIsADeepCopy: Clone's copy equals the original, shares nothing with it (changing
// the copy's nested messages leaves the original as it was), and a nil message stays nil.
func TestCloneIsADeepCopy(t *testing.T) {
	in := cloneSample()
	want := proto.Clone(in)
	out := Clone(in)
	if !proto.Equal(out, in) {
		t.Fatalf("Clone(%v) = %v", in, out)
	}
	out.Key.Index = 4
	out.InstanceKey.CellId = "cell-8"
	out.NetInfo.Ports[0].HostPort = 1
	out.NetInfo.Ports = append(out.NetInfo.Ports, &modelsv1.PortMapping{ContainerPort: 1})
	out.Since.Seconds++
	out.ModificationTag.Index++
	if !proto.Equal(in, want) {
		t.Fatalf("changing the copy changed the original: %v, want %v", in, want)
	}
	if got := Clone((*modelsv1.ActualLRP)(nil)); got != nil {
		t.Fatalf("Clone(nil) = %v, want nil", got)
	}
}

// BenchmarkClone compares Clone with proto.Clone on an instance record, the copy every state
// change on the BBS makes.
func BenchmarkClone(b *testing.B) {
	in := cloneSample()
	b.Run("proto.Clone", func(b *testing.B) {
		b.ReportAllocs()
		for b.Loop() {
			_ = proto.Clone(in).(*modelsv1.ActualLRP)
		}
	})
	b.Run("Clone", func(b *testing.B) {
		b.ReportAllocs()
		for b.Loop() {
			_ = Clone(in)
		}
	})
}
