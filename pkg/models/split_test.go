package models

import (
	"testing"

	"google.golang.org/protobuf/proto"
	"google.golang.org/protobuf/reflect/protoreflect"

	modelsv1 "github.com/gavel-sched/gavel/pkg/gen/gavel/models/v1"
)

// populate sets every field of m to a non-zero value (the first member of each oneof, one entry
// of each map and list), so that a field added to the message is populated without test changes.
func populate(t *testing.T, m protoreflect.Message, depth int) {
	t.Helper()
	if depth > 6 {
		t.Fatalf("populate: %s nests too deeply", m.Descriptor().FullName())
	}
	fields := m.Descriptor().Fields()
	for i := 0; i < fields.Len(); i++ {
		fd := fields.Get(i)
		if od := fd.ContainingOneof(); od != nil && !od.IsSynthetic() && od.Fields().Get(0) != fd {
			continue
		}
		switch {
		case fd.IsMap():
			mp := m.Mutable(fd).Map()
			k := scalar(t, fd.MapKey()).MapKey()
			if fd.MapValue().Message() != nil {
				populate(t, mp.Mutable(k).Message(), depth+1)
			} else {
				mp.Set(k, scalar(t, fd.MapValue()))
			}
		case fd.IsList():
			l := m.Mutable(fd).List()
			if fd.Message() != nil {
				populate(t, l.AppendMutable().Message(), depth+1)
			} else {
				l.Append(scalar(t, fd))
			}
		case fd.Message() != nil:
			populate(t, m.Mutable(fd).Message(), depth+1)
		default:
			m.Set(fd, scalar(t, fd))
		}
	}
}

// scalar returns a non-zero value of fd's kind.
func scalar(t *testing.T, fd protoreflect.FieldDescriptor) protoreflect.Value {
	t.Helper()
	switch fd.Kind() {
	case protoreflect.BoolKind:
		return protoreflect.ValueOfBool(true)
	case protoreflect.Int32Kind, protoreflect.Sint32Kind, protoreflect.Sfixed32Kind:
		return protoreflect.ValueOfInt32(7)
	case protoreflect.Int64Kind, protoreflect.Sint64Kind, protoreflect.Sfixed64Kind:
		return protoreflect.ValueOfInt64(7)
	case protoreflect.Uint32Kind, protoreflect.Fixed32Kind:
		return protoreflect.ValueOfUint32(7)
	case protoreflect.Uint64Kind, protoreflect.Fixed64Kind:
		return protoreflect.ValueOfUint64(7)
	case protoreflect.FloatKind:
		return protoreflect.ValueOfFloat32(7)
	case protoreflect.DoubleKind:
		return protoreflect.ValueOfFloat64(7)
	case protoreflect.StringKind:
		return protoreflect.ValueOfString("v-" + string(fd.Name()))
	case protoreflect.BytesKind:
		return protoreflect.ValueOfBytes([]byte(`{"field":"` + string(fd.Name()) + `"}`))
	case protoreflect.EnumKind:
		return protoreflect.ValueOfEnum(fd.Enum().Values().Get(fd.Enum().Values().Len() - 1).Number())
	}
	t.Fatalf("scalar: unsupported kind %s of %s", fd.Kind(), fd.FullName())
	return protoreflect.Value{}
}

func fullLRP(t *testing.T) *modelsv1.DesiredLRP {
	d := &modelsv1.DesiredLRP{}
	populate(t, d.ProtoReflect(), 0)
	fields := d.ProtoReflect().Descriptor().Fields()
	for i := 0; i < fields.Len(); i++ {
		if !d.ProtoReflect().Has(fields.Get(i)) {
			t.Fatalf("populate left %s unset", fields.Get(i).Name())
		}
	}
	return d
}

func TestSplitJoinRoundTrip(t *testing.T) {
	tests := []struct {
		name string
		lrp  *modelsv1.DesiredLRP
	}{
		{"every field set", fullLRP(t)},
		{"valid", validLRP()},
		{"empty", &modelsv1.DesiredLRP{}},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			got := JoinDesiredLRP(SchedulingInfo(tt.lrp), RunInfo(tt.lrp))
			if !proto.Equal(got, tt.lrp) {
				t.Errorf("Join(Split(d)) differs from d:\n got %v\nwant %v", got, tt.lrp)
			}
		})
	}
}

func TestSplitHalvesAreComplete(t *testing.T) {
	// Every field of both halves must be filled from a fully populated DesiredLRP, so a field
	// added to a half and forgotten in SchedulingInfo or RunInfo is caught.
	d := fullLRP(t)
	for _, m := range []proto.Message{SchedulingInfo(d), RunInfo(d)} {
		r := m.ProtoReflect()
		fields := r.Descriptor().Fields()
		for i := 0; i < fields.Len(); i++ {
			if !r.Has(fields.Get(i)) {
				t.Errorf("%s.%s is not set", r.Descriptor().Name(), fields.Get(i).Name())
			}
		}
	}
}

func TestJoinWithoutRunInfo(t *testing.T) {
	d := fullLRP(t)
	got := JoinDesiredLRP(SchedulingInfo(d), nil)
	want := &modelsv1.DesiredLRP{
		ProcessGuid:         d.GetProcessGuid(),
		Domain:              d.GetDomain(),
		LogGuid:             d.GetLogGuid(),
		Rootfs:              d.GetRootfs(),
		Instances:           d.GetInstances(),
		MemoryMb:            d.GetMemoryMb(),
		DiskMb:              d.GetDiskMb(),
		MaxPids:             d.GetMaxPids(),
		PlacementConstraint: d.GetPlacementConstraint(),
		Labels:              d.GetLabels(),
		Annotation:          d.GetAnnotation(),
		Routes:              d.GetRoutes(),
		ModificationTag:     d.GetModificationTag(),
		SpreadWith:          d.GetSpreadWith(),
	}
	if !proto.Equal(got, want) {
		t.Errorf("Join(s, nil) = %v, want %v", got, want)
	}
	if JoinDesiredLRP(nil, RunInfo(d)) != nil || SchedulingInfo(nil) != nil || RunInfo(nil) != nil {
		t.Error("nil inputs must give nil")
	}
}

func TestSplitSharesNoMemory(t *testing.T) {
	d := fullLRP(t)
	before := proto.Clone(d)
	s, r := SchedulingInfo(d), RunInfo(d)
	s.Labels["x"] = "changed"
	s.Routes["v-key"][0] = 'X'
	s.PlacementConstraint.Require[0] = "changed"
	r.Properties["x"] = "changed"
	r.Ports[0] = 1
	r.Env[0].Name = "changed"
	r.Action.GetRun().Path = "changed"
	if !proto.Equal(d, before) {
		t.Errorf("changing the halves changed d:\n got %v\nwant %v", d, before)
	}
}
