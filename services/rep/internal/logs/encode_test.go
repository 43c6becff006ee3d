package logs

import (
	"encoding/json"
	"testing"
	"time"
)

// FuzzAppendLine: what appendLine writes reads back (json.Unmarshal) as what json.Marshal's
// encoding of the same line reads back as, for any text, source and guid: control characters,
// quotes, backslashes, HTML characters, invalid UTF-8.
func FuzzAppendLine(f *testing.F) {
	for _, s := range []string{"", "plain line", `quote " and \ backslash`, "tab\tcr\rnl\nnul\x00bell\x07\x1f",
		"<html> & 'x'", "ünïcödé ✓ 😀", "bad \xff\xfe utf8 \xc3", "line sep \u2028 \u2029", "\x7f del"} {
		f.Add(s, "APP/PROC/WEB", int32(3), int64(1764000000123456789))
	}
	f.Fuzz(func(t *testing.T, text, source string, index int32, nanos int64) {
		l := Line{Time: time.Unix(0, nanos).UTC(), Source: source, Stream: Stderr, Index: index, InstanceGuid: "g-\x01" + source, Text: text}
		got := appendLine(nil, l)
		if len(got) == 0 || got[len(got)-1] != '\n' {
			t.Fatalf("%q: no newline at the end", got)
		}
		want, err := json.Marshal(l)
		if err != nil {
			t.Skip(err) // a time json cannot encode (year outside [0,9999])
		}
		var a, b Line
		if err := json.Unmarshal(got[:len(got)-1], &a); err != nil {
			t.Fatalf("%q does not parse: %v", got, err)
		}
		if err := json.Unmarshal(want, &b); err != nil {
			t.Fatal(err)
		}
		if !a.Time.Equal(b.Time) || a.Source != b.Source || a.Stream != b.Stream || a.Index != b.Index ||
			a.InstanceGuid != b.InstanceGuid || a.Text != b.Text {
			t.Fatalf("appendLine reads back as %+v, json.Marshal's as %+v", a, b)
		}
	})
}

// BenchmarkAppendLine against json.Marshal, the encoding it replaced.
func BenchmarkAppendLine(b *testing.B) {
	l := Line{Time: time.Now().UTC(), Source: SourceLRP, Stream: Stdout, Index: 2, InstanceGuid: "6f1c2a4e-9d3b-4c55-8a77-0e2b1f9c3d10",
		Text: `2026-11-26T15:04:05Z INFO request handled path=/api/v1/items status=200 duration_ms=12`}
	b.Run("appendLine", func(b *testing.B) {
		var buf []byte
		for b.Loop() {
			buf = appendLine(buf[:0], l)
		}
	})
	b.Run("json.Marshal", func(b *testing.B) {
		for b.Loop() {
			data, _ := json.Marshal(l)
			_ = append(data, '\n')
		}
	})
}
