// Package wire encodes Gavel's protobuf messages with the code generated for them
// (protoc-gen-go-vtproto: MarshalVT, UnmarshalVT, SizeVT beside each message), which runs in
// about half the time of the protobuf runtime's reflection-driven encoding and a third for
// marshalling, and falls back to that runtime for any other message. Codec is gRPC's codec on
// it, used by every server and client grpcx builds; Marshal and Unmarshal are the same for
// records stored in etcd (docs/decisions/0054-generated-encoding.md).
package wire

import (
	"google.golang.org/grpc/encoding"
	grpcproto "google.golang.org/grpc/encoding/proto"
	"google.golang.org/grpc/mem"
	"google.golang.org/protobuf/proto"
)

// fast is what the generated code gives each of Gavel's messages.
type fast interface {
	SizeVT() int
	MarshalToSizedBufferVT(dAtA []byte) (int, error)
	UnmarshalVT(dAtA []byte) error
}

// Marshal encodes m, with its generated code when it has it. The encoding is the protobuf
// runtime's, field for field (unknown fields last, as the runtime writes them).
func Marshal(m proto.Message) ([]byte, error) {
	f, ok := m.(fast)
	if !ok {
		return proto.Marshal(m)
	}
	return marshal(f, make([]byte, f.SizeVT()))
}

// marshal writes f's encoding into b, which is f.SizeVT() long.
func marshal(f fast, b []byte) ([]byte, error) {
	if _, err := f.MarshalToSizedBufferVT(b); err != nil {
		return nil, err
	}
	return b, nil
}

// Unmarshal resets m and decodes b into it, with its generated code when it has it. Strings
// and bytes are copied: m keeps nothing of b.
func Unmarshal(b []byte, m proto.Message) error {
	f, ok := m.(fast)
	if !ok {
		return proto.Unmarshal(b, m)
	}
	proto.Reset(m)
	return f.UnmarshalVT(b)
}

// Codec is gRPC's protobuf codec ("proto") encoding Gavel's messages with their generated
// code and every other message (health checks, reflection) as gRPC's own codec does. A
// message's encoding goes into a buffer of gRPC's pool when it is large enough to be pooled,
// which the transport returns once written, as gRPC's codec does.
func Codec() encoding.CodecV2 { return codec{encoding.GetCodecV2(grpcproto.Name)} }

type codec struct{ grpc encoding.CodecV2 }

// Name implements encoding.CodecV2: the content-subtype stays "proto".
func (codec) Name() string { return grpcproto.Name }

// Marshal implements encoding.CodecV2.
func (c codec) Marshal(v any) (mem.BufferSlice, error) {
	f, ok := v.(fast)
	if !ok {
		return c.grpc.Marshal(v)
	}
	size := f.SizeVT()
	if mem.IsBelowBufferPoolingThreshold(size) {
		b, err := marshal(f, make([]byte, size))
		if err != nil {
			return nil, err
		}
		return mem.BufferSlice{mem.SliceBuffer(b)}, nil
	}
	pool := mem.DefaultBufferPool()
	buf := pool.Get(size)
	*buf = (*buf)[:size]
	if _, err := marshal(f, *buf); err != nil {
		pool.Put(buf)
		return nil, err
	}
	return mem.BufferSlice{mem.NewBuffer(buf, pool)}, nil
}

// Unmarshal implements encoding.CodecV2.
func (c codec) Unmarshal(data mem.BufferSlice, v any) error {
	m, ok := v.(interface {
		proto.Message
		fast
	})
	if !ok {
		return c.grpc.Unmarshal(data, v)
	}
	buf := data.MaterializeToBuffer(mem.DefaultBufferPool())
	defer buf.Free()
	return Unmarshal(buf.ReadOnlyData(), m)
}
