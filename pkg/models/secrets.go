package models

import (
	"google.golang.org/protobuf/proto"
	"google.golang.org/protobuf/reflect/protoreflect"

	modelsv1 "github.com/gavel-sched/gavel/pkg/gen/gavel/models/v1"
)

// Redacted replaces the value of a secret env var in an answer to a caller who may not read
// secrets.
const Redacted = "<redacted>"

var envVarName = (&modelsv1.EnvironmentVariable{}).ProtoReflect().Descriptor().FullName()

// HasSecret reports whether m, anywhere in its tree of messages (a desired LRP's env and
// actions, a task's definition, an event's before and after), holds an env var marked secret
// whose value is neither empty nor already Redacted. It only reads m.
func HasSecret(m proto.Message) bool {
	if m == nil {
		return false
	}
	found := false
	walkEnv(m.ProtoReflect(), func(e *modelsv1.EnvironmentVariable) bool {
		found = hidden(e)
		return !found
	})
	return found
}

// RedactSecrets returns m with every secret env value replaced by Redacted: m itself when it
// holds no secret (no copy), otherwise a deep copy, so a cached message is never changed.
func RedactSecrets[T proto.Message](m T) T {
	if !HasSecret(m) {
		return m
	}
	out := proto.Clone(m).(T)
	walkEnv(out.ProtoReflect(), func(e *modelsv1.EnvironmentVariable) bool {
		if hidden(e) {
			e.Value = Redacted
		}
		return true
	})
	return out
}

// hidden reports whether e's value is a secret still to redact.
func hidden(e *modelsv1.EnvironmentVariable) bool {
	return e.GetSecret() && e.GetValue() != "" && e.GetValue() != Redacted
}

// walkEnv calls f on every EnvironmentVariable in m's tree (fields, lists and map values of
// messages) until f returns false; it reports whether the walk went to the end.
func walkEnv(m protoreflect.Message, f func(*modelsv1.EnvironmentVariable) bool) bool {
	if !m.IsValid() {
		return true
	}
	if m.Descriptor().FullName() == envVarName {
		if e, ok := m.Interface().(*modelsv1.EnvironmentVariable); ok {
			return f(e)
		}
		return true
	}
	more := true
	m.Range(func(fd protoreflect.FieldDescriptor, v protoreflect.Value) bool {
		switch {
		case fd.IsList() && fd.Message() != nil:
			l := v.List()
			for i := 0; i < l.Len() && more; i++ {
				more = walkEnv(l.Get(i).Message(), f)
			}
		case fd.IsMap() && fd.MapValue().Message() != nil:
			v.Map().Range(func(_ protoreflect.MapKey, mv protoreflect.Value) bool {
				more = walkEnv(mv.Message(), f)
				return more
			})
		case fd.Message() != nil && !fd.IsMap():
			more = walkEnv(v.Message(), f)
		}
		return more
	})
	return more
}
