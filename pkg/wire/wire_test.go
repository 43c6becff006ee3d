package wire_test

import (
	"bytes"
	"fmt"
	"math/rand/v2"
	"strings"
	"testing"

	"google.golang.org/grpc/encoding"
	grpcproto "google.golang.org/grpc/encoding/proto"
	healthpb "google.golang.org/grpc/health/grpc_health_v1"
	"google.golang.org/grpc/mem"
	"google.golang.org/protobuf/encoding/protowire"
	"google.golang.org/protobuf/proto"
	"google.golang.org/protobuf/reflect/protoreflect"
	"google.golang.org/protobuf/reflect/protoregistry"
	"google.golang.org/protobuf/types/known/timestamppb"

	// Every Gavel message type, registered.
	_ "github.com/gavel-sched/gavel/pkg/gen/gavel/auctioneer/v1"
	bbsv1 "github.com/gavel-sched/gavel/pkg/gen/gavel/bbs/v1"
	modelsv1 "github.com/gavel-sched/gavel/pkg/gen/gavel/models/v1"
	_ "github.com/gavel-sched/gavel/pkg/gen/gavel/nsync/v1"
	_ "github.com/gavel-sched/gavel/pkg/gen/gavel/rep/v1"
	_ "github.com/gavel-sched/gavel/pkg/gen/gavel/routeemitter/v1"
	"github.com/gavel-sched/gavel/pkg/wire"
)

// fill sets every field of m to a random value, nested messages to depth levels.
func fill(r *rand.Rand, m protoreflect.Message, depth int) {
	fields := m.Descriptor().Fields()
	for i := range fields.Len() {
		fd := fields.Get(i)
		if fd.ContainingOneof() != nil && !fd.ContainingOneof().IsSynthetic() && r.IntN(2) == 0 {
			continue // a oneof keeps the last member set; leave some unset
		}
		switch {
		case fd.IsMap():
			mp := m.Mutable(fd).Map()
			for range 1 + r.IntN(3) {
				k := scalar(r, fd.MapKey()).MapKey()
				if fd.MapValue().Kind() == protoreflect.MessageKind {
					if depth == 0 {
						continue
					}
					v := mp.NewValue()
					fill(r, v.Message(), depth-1)
					mp.Set(k, v)
				} else {
					mp.Set(k, scalar(r, fd.MapValue()))
				}
			}
		case fd.IsList():
			l := m.Mutable(fd).List()
			for range 1 + r.IntN(3) {
				if fd.Kind() == protoreflect.MessageKind || fd.Kind() == protoreflect.GroupKind {
					if depth == 0 {
						break
					}
					v := l.NewElement()
					fill(r, v.Message(), depth-1)
					l.Append(v)
				} else {
					l.Append(scalar(r, fd))
				}
			}
		case fd.Kind() == protoreflect.MessageKind || fd.Kind() == protoreflect.GroupKind:
			if depth > 0 {
				fill(r, m.Mutable(fd).Message(), depth-1)
			}
		default:
			m.Set(fd, scalar(r, fd))
		}
	}
}

func scalar(r *rand.Rand, fd protoreflect.FieldDescriptor) protoreflect.Value {
	switch fd.Kind() {
	case protoreflect.BoolKind:
		return protoreflect.ValueOfBool(true)
	case protoreflect.EnumKind:
		vals := fd.Enum().Values()
		return protoreflect.ValueOfEnum(vals.Get(r.IntN(vals.Len())).Number())
	case protoreflect.Int32Kind, protoreflect.Sint32Kind, protoreflect.Sfixed32Kind:
		return protoreflect.ValueOfInt32(r.Int32() - 1<<30)
	case protoreflect.Int64Kind, protoreflect.Sint64Kind, protoreflect.Sfixed64Kind:
		return protoreflect.ValueOfInt64(r.Int64() - 1<<62)
	case protoreflect.Uint32Kind, protoreflect.Fixed32Kind:
		return protoreflect.ValueOfUint32(r.Uint32())
	case protoreflect.Uint64Kind, protoreflect.Fixed64Kind:
		return protoreflect.ValueOfUint64(r.Uint64())
	case protoreflect.FloatKind:
		return protoreflect.ValueOfFloat32(r.Float32())
	case protoreflect.DoubleKind:
		return protoreflect.ValueOfFloat64(r.Float64())
	case protoreflect.StringKind:
		return protoreflect.ValueOfString(fmt.Sprintf("s-%d-é", r.IntN(1000)))
	case protoreflect.BytesKind:
		return protoreflect.ValueOfBytes([]byte{byte(r.IntN(256)), 0, 0xff})
	}
	panic(fmt.Sprintf("no value for kind %v", fd.Kind()))
}

// gavelMessages is every message type Gavel's protos define.
func gavelMessages(t *testing.T) []protoreflect.MessageType {
	var out []protoreflect.MessageType
	protoregistry.GlobalTypes.RangeMessages(func(mt protoreflect.MessageType) bool {
		if strings.HasPrefix(string(mt.Descriptor().FullName()), "gavel.") {
			out = append(out, mt)
		}
		return true
	})
	if len(out) < 50 {
		t.Fatalf("only %d Gavel message types registered", len(out))
	}
	return out
}

// TestGeneratedEncodingIsTheRuntimes checks every Gavel message, filled at random with unknown
// fields appended, both ways: what wire encodes the protobuf runtime decodes as the same
// message, and what the runtime encodes wire decodes as the same. Messages without maps (whose
// order neither side fixes) encode to the very same bytes.
func TestGeneratedEncodingIsTheRuntimes(t *testing.T) {
	r := rand.New(rand.NewPCG(1, 2))
	unknown := protowire.AppendTag(nil, 9999, protowire.BytesType)
	unknown = protowire.AppendBytes(unknown, []byte("kept"))
	for _, mt := range gavelMessages(t) {
		name := string(mt.Descriptor().FullName())
		if _, ok := mt.New().Interface().(interface{ UnmarshalVT([]byte) error }); !ok {
			t.Errorf("%s has no generated encoding", name)
			continue
		}
		cloner, ok := mt.Zero().Interface().(interface{ CloneMessageVT() proto.Message })
		if !ok {
			t.Errorf("%s has no generated copy", name)
			continue
		}
		if cloner.CloneMessageVT().ProtoReflect().IsValid() {
			t.Errorf("%s: the generated copy of nil is not nil", name)
		}
		for round := range 5 {
			in := mt.New()
			fill(r, in, 3)
			in.SetUnknown(unknown)
			msg := in.Interface()

			viaWire, err := wire.Marshal(msg)
			if err != nil {
				t.Fatalf("%s: wire.Marshal: %v", name, err)
			}
			viaRuntime, err := proto.Marshal(msg)
			if err != nil {
				t.Fatalf("%s: proto.Marshal: %v", name, err)
			}
			if !hasMap(mt.Descriptor()) && !bytes.Equal(viaWire, viaRuntime) {
				t.Errorf("%s round %d: wire's encoding differs from the runtime's", name, round)
			}

			runtimeOut := mt.New().Interface()
			if err := proto.Unmarshal(viaWire, runtimeOut); err != nil {
				t.Fatalf("%s: proto.Unmarshal of wire's encoding: %v", name, err)
			}
			wireOut := mt.New().Interface()
			fill(r, wireOut.ProtoReflect(), 1) // Unmarshal replaces what was there
			if err := wire.Unmarshal(viaRuntime, wireOut); err != nil {
				t.Fatalf("%s: wire.Unmarshal: %v", name, err)
			}
			for what, out := range map[string]proto.Message{"runtime decoding wire's": runtimeOut, "wire decoding the runtime's": wireOut} {
				if !proto.Equal(msg, out) {
					t.Errorf("%s round %d: %s encoding: got %v, want %v", name, round, what, out, msg)
				}
			}

			// The generated copy (CloneVT, which the services call instead of proto.Clone) is
			// the runtime's: equal, and sharing nothing (the copy filled again at random leaves
			// the original as it was).
			want := proto.Clone(msg)
			copied := msg.(interface{ CloneMessageVT() proto.Message }).CloneMessageVT()
			if !proto.Equal(copied, msg) {
				t.Errorf("%s round %d: generated copy %v, want %v", name, round, copied, msg)
			}
			// The generated comparison (EqualVT, which the route-emitter's table calls instead
			// of proto.Equal) is the runtime's: a message equals its copy, and a copy filled
			// again at random differs from it exactly when proto.Equal says so.
			eq, ok := msg.(interface{ EqualMessageVT(proto.Message) bool })
			if !ok {
				t.Errorf("%s has no generated comparison", name)
			} else if !eq.EqualMessageVT(copied) {
				t.Errorf("%s round %d: not equal to its copy by the generated comparison", name, round)
			}
			fill(r, copied.ProtoReflect(), 3)
			if !proto.Equal(msg, want) {
				t.Errorf("%s round %d: changing the generated copy changed the original", name, round)
			}
			if ok && eq.EqualMessageVT(copied) != proto.Equal(msg, copied) {
				t.Errorf("%s round %d: generated comparison %v, runtime's %v", name, round, eq.EqualMessageVT(copied), proto.Equal(msg, copied))
			}
		}
	}
}

func hasMap(md protoreflect.MessageDescriptor) bool {
	return hasMapSeen(md, map[protoreflect.FullName]bool{})
}

func hasMapSeen(md protoreflect.MessageDescriptor, seen map[protoreflect.FullName]bool) bool {
	if seen[md.FullName()] {
		return false
	}
	seen[md.FullName()] = true
	fields := md.Fields()
	for i := range fields.Len() {
		fd := fields.Get(i)
		if fd.IsMap() || (fd.Message() != nil && hasMapSeen(fd.Message(), seen)) {
			return true
		}
	}
	return false
}

// TestUnmarshalKeepsNothingOfTheInput checks a decoded message shares no memory with the
// buffer it came from: gRPC reuses it.
func TestUnmarshalKeepsNothingOfTheInput(t *testing.T) {
	r := rand.New(rand.NewPCG(3, 4))
	for _, mt := range gavelMessages(t) {
		in := mt.New()
		fill(r, in, 3)
		b, err := wire.Marshal(in.Interface())
		if err != nil {
			t.Fatal(err)
		}
		out := mt.New().Interface()
		if err := wire.Unmarshal(b, out); err != nil {
			t.Fatal(err)
		}
		clear(b)
		if !proto.Equal(in.Interface(), out) {
			t.Fatalf("%s changed when its encoding was overwritten", mt.Descriptor().FullName())
		}
	}
}

// TestCodec sends Gavel's messages, small and pooled-large, through the codec and back, and
// others (a health check) through gRPC's codec, as gRPC's codec encodes them.
func TestCodec(t *testing.T) {
	c := wire.Codec()
	if c.Name() != grpcproto.Name {
		t.Fatalf("codec name %q, want %q", c.Name(), grpcproto.Name)
	}
	r := rand.New(rand.NewPCG(5, 6))
	for _, mt := range gavelMessages(t) {
		for _, depth := range []int{0, 3} {
			in := mt.New()
			fill(r, in, depth)
			data, err := c.Marshal(in.Interface())
			if err != nil {
				t.Fatal(err)
			}
			out := mt.New().Interface()
			if err := c.Unmarshal(data, out); err != nil {
				t.Fatal(err)
			}
			data.Free()
			if !proto.Equal(in.Interface(), out) {
				t.Fatalf("%s: codec round trip: got %v, want %v", mt.Descriptor().FullName(), out, in.Interface())
			}
		}
	}
	// Gavel's messages past the pooling threshold, and a health check on both sides of it.
	for _, n := range []int{1000, 100_000} {
		list := &bbsv1.ActualLRPsResponse{Revision: int64(n)}
		for i := range n {
			list.ActualLrps = append(list.ActualLrps, &modelsv1.ActualLRP{
				Key:   &modelsv1.ActualLRPKey{ProcessGuid: fmt.Sprintf("guid-%d", i), Index: int32(i % 10), Domain: "d"},
				State: modelsv1.ActualLRP_STATE_RUNNING,
			})
		}
		data, err := c.Marshal(list)
		if err != nil {
			t.Fatal(err)
		}
		if mem.IsBelowBufferPoolingThreshold(data.Len()) {
			t.Fatalf("a list of %d is %d bytes, below the pooling threshold", n, data.Len())
		}
		out := &bbsv1.ActualLRPsResponse{}
		if err := c.Unmarshal(data, out); err != nil {
			t.Fatal(err)
		}
		data.Free()
		if !proto.Equal(list, out) {
			t.Fatalf("a list of %d: codec round trip differs", n)
		}
	}
	big := &healthpb.HealthCheckRequest{Service: strings.Repeat("x", 1<<20)}
	for _, m := range []proto.Message{&healthpb.HealthCheckResponse{Status: healthpb.HealthCheckResponse_SERVING}, big} {
		data, err := c.Marshal(m)
		if err != nil {
			t.Fatal(err)
		}
		want, err := encoding.GetCodecV2(grpcproto.Name).Marshal(m)
		if err != nil {
			t.Fatal(err)
		}
		if !bytes.Equal(data.Materialize(), want.Materialize()) {
			t.Errorf("%T: encoded unlike gRPC's codec", m)
		}
		out := m.ProtoReflect().New().Interface()
		if err := c.Unmarshal(data, out); err != nil || !proto.Equal(m, out) {
			t.Errorf("%T: round trip: %v", m, err)
		}
	}
}

// BenchmarkClone compares the generated copy with proto.Clone on an instance record, the copy
// every state change on the BBS makes.
func BenchmarkClone(b *testing.B) {
	in := &modelsv1.ActualLRP{
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
	b.Run("proto.Clone", func(b *testing.B) {
		b.ReportAllocs()
		for b.Loop() {
			_ = proto.Clone(in).(*modelsv1.ActualLRP)
		}
	})
	b.Run("CloneVT", func(b *testing.B) {
		b.ReportAllocs()
		for b.Loop() {
			_ = in.CloneVT()
		}
	})
}
