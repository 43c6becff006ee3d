package models

import (
	"sync"

	"google.golang.org/protobuf/proto"
	"google.golang.org/protobuf/reflect/protoreflect"
	"google.golang.org/protobuf/types/descriptorpb"

	modelsv1 "github.com/gavel-sched/gavel/pkg/gen/gavel/models/v1"
)

// Redacted replaces the value of a secret env var in an answer to a caller who may not read
// secrets.
const Redacted = "<redacted>"

var envVarName = (&modelsv1.EnvironmentVariable{}).ProtoReflect().Descriptor().FullName()

// HasSecret reports whether m, anywhere in its tree of messages (a desired LRP's env and
// actions, a task's definition, an event's before and after), holds a secret whose value is
// neither empty nor already Redacted: an env var marked secret, or a string field declared
// with the debug_redact option (a desired LRP's or task's image_password). It only reads m.
func HasSecret(m proto.Message) bool {
	if m == nil {
		return false
	}
	found := false
	walkSecrets(m.ProtoReflect(), func(v string, _ func()) bool {
		found = hidden(v)
		return !found
	})
	return found
}

// RedactSecrets returns m with every secret value replaced by Redacted: m itself when it
// holds no secret (no copy), otherwise a deep copy, so a cached message is never changed.
func RedactSecrets[T proto.Message](m T) T {
	if !HasSecret(m) {
		return m
	}
	out := proto.Clone(m).(T)
	walkSecrets(out.ProtoReflect(), func(v string, redact func()) bool {
		if hidden(v) {
			redact()
		}
		return true
	})
	return out
}

// hidden reports whether a secret's value v is still to redact.
func hidden(v string) bool {
	return v != "" && v != Redacted
}

// debugRedact reports whether fd is a string field declared with [debug_redact = true].
func debugRedact(fd protoreflect.FieldDescriptor) bool {
	if fd.Kind() != protoreflect.StringKind || fd.IsList() || fd.IsMap() {
		return false
	}
	o, ok := fd.Options().(*descriptorpb.FieldOptions)
	return ok && o.GetDebugRedact()
}

// walkSecrets calls f with the value of every secret in m's tree (fields, lists and map values
// of messages) and the function that replaces it by Redacted, until f returns false; it
// reports whether the walk went to the end. The secrets are the values of EnvironmentVariables
// marked secret and the string fields declared with debug_redact.
func walkSecrets(m protoreflect.Message, f func(value string, redact func()) bool) bool {
	if !m.IsValid() || !mayHoldSecret(m.Descriptor()) {
		return true
	}
	if m.Descriptor().FullName() == envVarName {
		if e, ok := m.Interface().(*modelsv1.EnvironmentVariable); ok && e.GetSecret() {
			return f(e.GetValue(), func() { e.Value = Redacted })
		}
		return true
	}
	more := true
	m.Range(func(fd protoreflect.FieldDescriptor, v protoreflect.Value) bool {
		switch {
		case debugRedact(fd):
			more = f(v.String(), func() { m.Set(fd, protoreflect.ValueOfString(Redacted)) })
		case fd.IsList() && fd.Message() != nil:
			l := v.List()
			for i := 0; i < l.Len() && more; i++ {
				more = walkSecrets(l.Get(i).Message(), f)
			}
		case fd.IsMap() && fd.MapValue().Message() != nil:
			v.Map().Range(func(_ protoreflect.MapKey, mv protoreflect.Value) bool {
				more = walkSecrets(mv.Message(), f)
				return more
			})
		case fd.Message() != nil && !fd.IsMap():
			more = walkSecrets(v.Message(), f)
		}
		return more
	})
	return more
}

// secretTypes caches mayHoldSecret by message type (protoreflect.FullName → bool).
var secretTypes sync.Map

// mayHoldSecret reports whether a message of type md can hold a secret anywhere in its tree:
// whether an EnvironmentVariable or a debug_redact string field is reachable from it. Most
// messages the BBS sends (actual LRPs and their events, cells) cannot, and are not walked.
func mayHoldSecret(md protoreflect.MessageDescriptor) bool {
	if v, ok := secretTypes.Load(md.FullName()); ok {
		return v.(bool)
	}
	// A secret is reachable from md when the walk over the types it reaches finds one; each
	// type is visited once, so recursive types end.
	seen := map[protoreflect.FullName]bool{}
	var reach func(md protoreflect.MessageDescriptor) bool
	reach = func(md protoreflect.MessageDescriptor) bool {
		if md.FullName() == envVarName {
			return true
		}
		if seen[md.FullName()] {
			return false
		}
		seen[md.FullName()] = true
		fields := md.Fields()
		for i := range fields.Len() {
			fd := fields.Get(i)
			if debugRedact(fd) {
				return true
			}
			if fd.IsMap() {
				fd = fd.MapValue()
			}
			if fd.Message() != nil && reach(fd.Message()) {
				return true
			}
		}
		return false
	}
	may := reach(md)
	secretTypes.Store(md.FullName(), may)
	return may
}
