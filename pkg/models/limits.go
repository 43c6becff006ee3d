package models

// Limits bounds the size of user-supplied work. A zero field means its default, so the zero
// Limits behaves like DefaultLimits.
type Limits struct {
	// MaxInstances is the largest instance count a DesiredLRP may ask for.
	MaxInstances int32
	// MaxAnnotationBytes bounds the annotation of a DesiredLRP or Task.
	MaxAnnotationBytes int
	// MaxPropertyBytes bounds the total size of the keys and values of properties.
	MaxPropertyBytes int
	// MaxRouteBytes bounds the total size of all route documents of a DesiredLRP.
	MaxRouteBytes int
	// IncomingPortMin and IncomingPortMax bound the incoming_port of TCP and UDP routes in
	// cf-router documents (inclusive); zero IncomingPortMax is no bound.
	IncomingPortMin, IncomingPortMax uint32
}

// Default limits, as Diego sets them.
const (
	// DefaultMaxInstances is the default of Limits.MaxInstances.
	DefaultMaxInstances = 1000
	// DefaultMaxAnnotationBytes is the default of Limits.MaxAnnotationBytes (10 KiB).
	DefaultMaxAnnotationBytes = 10 * 1024
	// DefaultMaxPropertyBytes is the default of Limits.MaxPropertyBytes (64 KiB).
	DefaultMaxPropertyBytes = 64 * 1024
	// DefaultMaxRouteBytes is the default of Limits.MaxRouteBytes (128 KiB).
	DefaultMaxRouteBytes = 128 * 1024
)

// DefaultLimits returns the default limits.
func DefaultLimits() Limits {
	return Limits{
		MaxInstances:       DefaultMaxInstances,
		MaxAnnotationBytes: DefaultMaxAnnotationBytes,
		MaxPropertyBytes:   DefaultMaxPropertyBytes,
		MaxRouteBytes:      DefaultMaxRouteBytes,
	}
}

// withDefaults replaces the zero (or negative) fields of l with their defaults.
func (l Limits) withDefaults() Limits {
	d := DefaultLimits()
	if l.MaxInstances <= 0 {
		l.MaxInstances = d.MaxInstances
	}
	if l.MaxAnnotationBytes <= 0 {
		l.MaxAnnotationBytes = d.MaxAnnotationBytes
	}
	if l.MaxPropertyBytes <= 0 {
		l.MaxPropertyBytes = d.MaxPropertyBytes
	}
	if l.MaxRouteBytes <= 0 {
		l.MaxRouteBytes = d.MaxRouteBytes
	}
	return l
}
