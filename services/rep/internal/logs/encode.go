package logs

import (
	"strconv"
	"time"
	"unicode/utf8"
)

// appendLine appends l as the JSON object json.Marshal makes of it (the same keys in the same
// order; strings escaped so that json.Unmarshal reads back what json.Marshal's output would
// give) and a newline. The writer encodes every captured line: reflection's encoder was the
// largest part of the rep's CPU while a container printed tens of thousands of lines a second.
func appendLine(b []byte, l Line) []byte {
	b = append(b, `{"t":"`...)
	b = l.Time.AppendFormat(b, time.RFC3339Nano)
	b = append(b, `","src":`...)
	b = appendString(b, l.Source)
	b = append(b, `,"s":`...)
	b = appendString(b, l.Stream)
	b = append(b, `,"i":`...)
	b = strconv.AppendInt(b, int64(l.Index), 10)
	b = append(b, `,"g":`...)
	b = appendString(b, l.InstanceGuid)
	b = append(b, `,"m":`...)
	b = appendString(b, l.Text)
	return append(b, "}\n"...)
}

const hexDigits = "0123456789abcdef"

// appendString appends s as a JSON string: quote, backslash and control characters escaped,
// invalid UTF-8 replaced by U+FFFD (as encoding/json does), everything else as is.
func appendString(b []byte, s string) []byte {
	b = append(b, '"')
	start := 0
	for i := 0; i < len(s); {
		c := s[i]
		if c < utf8.RuneSelf {
			if c >= 0x20 && c != '"' && c != '\\' {
				i++
				continue
			}
			b = append(b, s[start:i]...)
			switch c {
			case '"', '\\':
				b = append(b, '\\', c)
			case '\n':
				b = append(b, '\\', 'n')
			case '\r':
				b = append(b, '\\', 'r')
			case '\t':
				b = append(b, '\\', 't')
			default:
				b = append(b, '\\', 'u', '0', '0', hexDigits[c>>4], hexDigits[c&0xf])
			}
			i++
			start = i
			continue
		}
		r, size := utf8.DecodeRuneInString(s[i:])
		if r == utf8.RuneError && size == 1 {
			b = append(b, s[start:i]...)
			b = append(b, `\ufffd`...)
			i += size
			start = i
			continue
		}
		i += size
	}
	b = append(b, s[start:]...)
	return append(b, '"')
}
