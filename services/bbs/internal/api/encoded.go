package api

import (
	"google.golang.org/grpc/encoding"
	"google.golang.org/grpc/mem"
	"google.golang.org/protobuf/encoding/protowire"

	bbsv1 "github.com/gavel-sched/gavel/pkg/gen/gavel/bbs/v1"
	"github.com/gavel-sched/gavel/pkg/wire"
)

// actualLRPsField is the field number of ActualLRPsResponse.actual_lrps.
var actualLRPsField = (&bbsv1.ActualLRPsResponse{}).ProtoReflect().Descriptor().Fields().ByName("actual_lrps").Number()

// actualLRPsResponse is the answer of ActualLRPs with the records already encoded: each is
// appended as one occurrence of the actual_lrps field to the message's unknown fields, which
// protobuf marshals as they are. On the wire the answer is the one a response holding the
// decoded records gives, field for field, and a client decodes it as such; the BBS only copies
// bytes instead of marshalling every record again
// (docs/decisions/0053-actual-list-encoded-once.md), and Codec sends those bytes without
// copying them again. The buffer is taken from gRPC's buffer pool, to which Codec hands it back
// once sent, as gRPC does with the buffers its own codec marshals into. Only for sending, once:
// in this process the records are not in ActualLrps.
func actualLRPsResponse(records [][]byte, rev int64) *bbsv1.ActualLRPsResponse {
	n := 0
	for _, r := range records {
		n += protowire.SizeTag(actualLRPsField) + protowire.SizeBytes(len(r))
	}
	buf := (*mem.DefaultBufferPool().Get(n))[:0]
	for _, r := range records {
		buf = protowire.AppendTag(buf, actualLRPsField, protowire.BytesType)
		buf = protowire.AppendBytes(buf, r)
	}
	resp := &bbsv1.ActualLRPsResponse{Revision: rev}
	if len(buf) > 0 {
		resp.ProtoReflect().SetUnknown(buf)
	}
	return resp
}

// Codec is the BBS server's protobuf codec: every server's (wire.Codec), except that a list answer built by
// actualLRPsResponse is sent as its revision followed by its encoded records, the buffer as it
// is, instead of being copied into one more buffer of the list's size; the transport returns
// that buffer to gRPC's pool when it has written it.
func Codec() encoding.CodecV2 { return listCodec{wire.Codec()} }

type listCodec struct{ encoding.CodecV2 }

// Marshal implements encoding.CodecV2.
func (c listCodec) Marshal(v any) (mem.BufferSlice, error) {
	r, ok := v.(*bbsv1.ActualLRPsResponse)
	if !ok || len(r.GetActualLrps()) > 0 {
		return c.CodecV2.Marshal(v)
	}
	records := []byte(r.ProtoReflect().GetUnknown())
	if len(records) == 0 {
		return c.CodecV2.Marshal(v)
	}
	head, err := wire.Marshal(&bbsv1.ActualLRPsResponse{Revision: r.GetRevision()})
	if err != nil {
		return nil, err
	}
	return mem.BufferSlice{mem.SliceBuffer(head), mem.NewBuffer(&records, mem.DefaultBufferPool())}, nil
}
