package links

import (
	"encoding/json"
	"fmt"

	modelsv1 "github.com/gavel-sched/gavel/pkg/gen/gavel/models/v1"
)

// Node is the JSON of one link node: {name, id, index, az, address}, every field present.
type Node struct {
	// Name is the provider's link name.
	Name string `json:"name"`
	// ID is the instance guid.
	ID string `json:"id"`
	// Index is the instance index.
	Index int32 `json:"index"`
	// AZ is the zone of the instance's cell.
	AZ string `json:"az"`
	// Address is where to reach the instance on the chosen network.
	Address string `json:"address"`
}

// Document is the JSON a consumer receives for one link: {nodes, properties}, or for a
// colocated link resolved per instance {node, properties} (node is absent when no provider
// instance runs on the consumer's cell).
type Document struct {
	// Nodes are the provider's running instances (absent for a per-instance colocated link).
	Nodes *[]Node `json:"nodes,omitempty"`
	// Node is the provider instance on the consumer's cell (colocated links only).
	Node *Node `json:"node,omitempty"`
	// Properties are the provider link's properties.
	Properties map[string]string `json:"properties"`
}

// perInstance reports whether the link of consumer c named name is colocated and was resolved
// for one cell.
func perInstance(c LRP, name string, cellID string) bool {
	if cellID == "" {
		return false
	}
	for _, cl := range c.Links.GetConsumes() {
		if cl.GetName() == name {
			return cl.GetColocated()
		}
	}
	return false
}

// DocumentOf converts a resolved link; perInstance selects the {node} form.
func DocumentOf(rl *modelsv1.ResolvedLink, perInstance bool) Document {
	d := Document{Properties: rl.GetProperties()}
	if d.Properties == nil {
		d.Properties = map[string]string{}
	}
	conv := func(n *modelsv1.LinkNode) Node {
		return Node{Name: n.GetName(), ID: n.GetId(), Index: n.GetIndex(), AZ: n.GetAz(), Address: n.GetAddress()}
	}
	if perInstance {
		if n := rl.GetNode(); n != nil {
			cn := conv(n)
			d.Node = &cn
		}
		return d
	}
	nodes := make([]Node, 0, len(rl.GetNodes()))
	for _, n := range rl.GetNodes() {
		nodes = append(nodes, conv(n))
	}
	d.Nodes = &nodes
	return d
}

// Documents converts the links consumer c resolved for cellID ("" for the LRP-wide view) into
// documents keyed by link name.
func Documents(c LRP, links map[string]*modelsv1.ResolvedLink, cellID string) map[string]Document {
	out := make(map[string]Document, len(links))
	for name, rl := range links {
		out[name] = DocumentOf(rl, perInstance(c, name, cellID))
	}
	return out
}

// Marshal is the JSON of Documents: an object keyed by link name (what GAVEL_LINKS holds).
func Marshal(c LRP, links map[string]*modelsv1.ResolvedLink, cellID string) ([]byte, error) {
	b, err := json.Marshal(Documents(c, links, cellID))
	if err != nil {
		return nil, fmt.Errorf("marshal links of %s: %w", c.Guid, err)
	}
	return b, nil
}
