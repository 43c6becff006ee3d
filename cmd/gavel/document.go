package main

import (
	"bytes"
	"encoding/base64"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"os"
	"sort"
	"strings"
	"unicode/utf8"

	"go.yaml.in/yaml/v3"
	"google.golang.org/protobuf/encoding/protojson"
	"google.golang.org/protobuf/proto"
)

// Routes documents (DesiredLRP.routes, map<string,bytes>) are opaque JSON to Gavel. In the
// CLI's files and output they are written as native JSON instead of protojson's base64, and
// converted to and from the stored bytes byte for byte:
//   - in a JSON file, each routes value's bytes are stored exactly as written;
//   - in a YAML file, a value written as JSON (flow style, e.g. `cf-router: [{"port": 8080}]`)
//     or as a string holding JSON is stored exactly as written; any other YAML (block style,
//     unquoted keys) is converted to compact JSON with keys in document order;
//   - in -o json output, each routes value is the stored bytes, unchanged.

// readDocument reads path ("-" is stdin) as YAML or JSON (JSON is YAML), fills m from it with
// protojson's field names (lowerCamel or the proto names), and returns the routes documents
// found under the top-level key routesKey (empty: none), which m's own routes must not hold.
func readDocument(path string, m proto.Message, routesKey string) (map[string][]byte, error) {
	src, err := readInput(path)
	if err != nil {
		return nil, err
	}
	routes, jsonBody, err := splitDocument(src, routesKey)
	if err != nil {
		return nil, fmt.Errorf("%s: %w", path, err)
	}
	if err := protojson.Unmarshal(jsonBody, m); err != nil {
		return nil, fmt.Errorf("%s: %w", path, err)
	}
	return routes, nil
}

// readInput reads a file, or stdin for "-".
func readInput(path string) ([]byte, error) {
	if path == "-" {
		return io.ReadAll(os.Stdin)
	}
	b, err := os.ReadFile(path)
	if err != nil {
		return nil, fmt.Errorf("read %w", err)
	}
	return b, nil
}

// splitDocument parses src as YAML, takes the routes documents out of the top-level mapping's
// routesKey entry, and returns the rest as JSON.
func splitDocument(src []byte, routesKey string) (map[string][]byte, []byte, error) {
	var doc yaml.Node
	if err := yaml.Unmarshal(src, &doc); err != nil {
		return nil, nil, err
	}
	if doc.Kind != yaml.DocumentNode || len(doc.Content) != 1 || doc.Content[0].Kind != yaml.MappingNode {
		return nil, nil, errors.New("expected a mapping (an object) at the top level")
	}
	top := doc.Content[0]
	var routes map[string][]byte
	for i := 0; i+1 < len(top.Content); i += 2 {
		if routesKey == "" || top.Content[i].Value != routesKey {
			continue
		}
		r, err := routesFromNode(src, top.Content[i+1])
		if err != nil {
			return nil, nil, fmt.Errorf("%s: %w", routesKey, err)
		}
		routes = r
		top.Content = append(top.Content[:i], top.Content[i+2:]...)
		break
	}
	body, err := nodeJSON(top)
	if err != nil {
		return nil, nil, err
	}
	return routes, body, nil
}

// routesFromNode converts a routes mapping (provider → document) to stored bytes.
func routesFromNode(src []byte, n *yaml.Node) (map[string][]byte, error) {
	if n.Kind == yaml.ScalarNode && n.Tag == "!!null" {
		return nil, nil
	}
	if n.Kind != yaml.MappingNode {
		return nil, errors.New("must map a provider name to its routes document")
	}
	out := make(map[string][]byte, len(n.Content)/2)
	for i := 0; i+1 < len(n.Content); i += 2 {
		name, v := n.Content[i].Value, n.Content[i+1]
		b, err := routeBytes(src, v)
		if err != nil {
			return nil, fmt.Errorf("%s: %w", name, err)
		}
		out[name] = b
	}
	return out, nil
}

// routeBytes returns one routes document's bytes: the source text when it is written as JSON,
// the string's content when it is a string of JSON, otherwise compact JSON of the YAML value.
func routeBytes(src []byte, v *yaml.Node) ([]byte, error) {
	if v.Kind == yaml.ScalarNode && v.Tag == "!!str" && v.Style != 0 {
		if !json.Valid([]byte(v.Value)) {
			return nil, errors.New("a string routes document must hold JSON")
		}
		return []byte(v.Value), nil
	}
	if v.Style&yaml.FlowStyle != 0 || v.Kind == yaml.ScalarNode {
		if off, ok := offsetOf(src, v.Line, v.Column); ok {
			dec := json.NewDecoder(bytes.NewReader(src[off:]))
			var raw json.RawMessage
			if err := dec.Decode(&raw); err == nil {
				return []byte(raw), nil
			}
		}
	}
	return nodeJSON(v)
}

// offsetOf converts yaml's 1-based line and (character) column to a byte offset in src.
func offsetOf(src []byte, line, col int) (int, bool) {
	off := 0
	for l := 1; l < line; l++ {
		i := bytes.IndexByte(src[off:], '\n')
		if i < 0 {
			return 0, false
		}
		off += i + 1
	}
	for c := 1; c < col; c++ {
		if off >= len(src) || src[off] == '\n' {
			return 0, false
		}
		_, size := utf8.DecodeRune(src[off:])
		off += size
	}
	return off, off < len(src)
}

// nodeJSON converts a YAML node to compact JSON, keeping mapping keys in document order.
func nodeJSON(n *yaml.Node) ([]byte, error) {
	var buf bytes.Buffer
	if err := writeNodeJSON(&buf, n); err != nil {
		return nil, err
	}
	return buf.Bytes(), nil
}

func writeNodeJSON(buf *bytes.Buffer, n *yaml.Node) error {
	switch n.Kind {
	case yaml.DocumentNode:
		if len(n.Content) == 0 {
			buf.WriteString("null")
			return nil
		}
		return writeNodeJSON(buf, n.Content[0])
	case yaml.AliasNode:
		return writeNodeJSON(buf, n.Alias)
	case yaml.MappingNode:
		buf.WriteByte('{')
		for i := 0; i+1 < len(n.Content); i += 2 {
			if i > 0 {
				buf.WriteByte(',')
			}
			k, _ := json.Marshal(n.Content[i].Value)
			buf.Write(k)
			buf.WriteByte(':')
			if err := writeNodeJSON(buf, n.Content[i+1]); err != nil {
				return err
			}
		}
		buf.WriteByte('}')
	case yaml.SequenceNode:
		buf.WriteByte('[')
		for i, c := range n.Content {
			if i > 0 {
				buf.WriteByte(',')
			}
			if err := writeNodeJSON(buf, c); err != nil {
				return err
			}
		}
		buf.WriteByte(']')
	case yaml.ScalarNode:
		var v any
		if err := n.Decode(&v); err != nil {
			return fmt.Errorf("line %d: %w", n.Line, err)
		}
		b, err := json.Marshal(v)
		if err != nil {
			return fmt.Errorf("line %d: %w", n.Line, err)
		}
		buf.Write(b)
	default:
		return fmt.Errorf("line %d: unsupported YAML node", n.Line)
	}
	return nil
}

// docJSON renders m as indented JSON with protojson's lowerCamel names and sorted keys (stable
// across runs, unlike protojson's own output); scalar fields are present even when zero, so
// jq paths such as .key.index always resolve. Each routes map found at one of routesPaths
// (dotted paths of field names, e.g. "desiredLrp.routes"; "*" matches every element of a list)
// is printed with the stored bytes of each document as its value, byte for byte.
func docJSON(m proto.Message, routesPaths ...string) ([]byte, error) {
	b, err := protojson.MarshalOptions{EmitDefaultValues: true}.Marshal(m)
	if err != nil {
		return nil, err
	}
	var v any
	dec := json.NewDecoder(bytes.NewReader(b))
	dec.UseNumber()
	if err := dec.Decode(&v); err != nil {
		return nil, err
	}
	raws := map[string][]byte{}
	for _, p := range routesPaths {
		if err := replaceRoutes(v, strings.Split(p, "."), raws); err != nil {
			return nil, err
		}
	}
	// Not HTML-escaped: a redacted secret prints as "<redacted>", not "\u003credacted\u003e".
	var buf bytes.Buffer
	enc := json.NewEncoder(&buf)
	enc.SetEscapeHTML(false)
	enc.SetIndent("", "  ")
	if err := enc.Encode(v); err != nil {
		return nil, err
	}
	out := bytes.TrimSuffix(buf.Bytes(), []byte("\n"))
	for ph, raw := range raws {
		q, _ := json.Marshal(ph)
		out = bytes.Replace(out, q, raw, 1)
	}
	return out, nil
}

// replaceRoutes walks path in v and replaces each routes value (base64 in protojson) with a
// unique placeholder string, recording the decoded bytes to splice in after marshalling.
func replaceRoutes(v any, path []string, raws map[string][]byte) error {
	if len(path) == 0 {
		return nil
	}
	switch node := v.(type) {
	case []any:
		if path[0] != "*" {
			return nil
		}
		for _, e := range node {
			if err := replaceRoutes(e, path[1:], raws); err != nil {
				return err
			}
		}
	case map[string]any:
		child, ok := node[path[0]]
		if !ok {
			return nil
		}
		if len(path) > 1 {
			return replaceRoutes(child, path[1:], raws)
		}
		routes, ok := child.(map[string]any)
		if !ok {
			return nil
		}
		names := make([]string, 0, len(routes))
		for name := range routes {
			names = append(names, name)
		}
		sort.Strings(names)
		for _, name := range names {
			s, _ := routes[name].(string)
			raw, err := decodeBase64(s)
			if err != nil {
				return fmt.Errorf("routes %s: %w", name, err)
			}
			if !json.Valid(raw) {
				// Not JSON: keep it as a JSON string of its text so the output stays JSON.
				q, _ := json.Marshal(string(raw))
				raw = q
			}
			ph := fmt.Sprintf("\x00gavel-routes-%d\x00", len(raws))
			raws[ph] = raw
			routes[name] = ph
		}
	}
	return nil
}

// decodeBase64 decodes protojson's encoding of bytes (standard base64, padded).
func decodeBase64(s string) ([]byte, error) {
	return base64.StdEncoding.DecodeString(s)
}

// jsonToYAML re-renders JSON as block-style YAML, keeping the key order.
func jsonToYAML(b []byte) ([]byte, error) {
	var n yaml.Node
	if err := yaml.Unmarshal(b, &n); err != nil {
		return nil, err
	}
	blockStyle(&n)
	var buf bytes.Buffer
	enc := yaml.NewEncoder(&buf)
	enc.SetIndent(2)
	if err := enc.Encode(&n); err != nil {
		return nil, err
	}
	if err := enc.Close(); err != nil {
		return nil, err
	}
	return buf.Bytes(), nil
}

// blockStyle clears flow style on collections so YAML output is block style.
func blockStyle(n *yaml.Node) {
	if n.Kind == yaml.MappingNode || n.Kind == yaml.SequenceNode {
		n.Style &^= yaml.FlowStyle
	}
	if n.Kind == yaml.ScalarNode && n.Style&yaml.DoubleQuotedStyle != 0 && n.Tag == "!!str" {
		n.Style = 0
	}
	for _, c := range n.Content {
		blockStyle(c)
	}
}
