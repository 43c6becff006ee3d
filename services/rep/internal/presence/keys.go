package presence

import "github.com/gavel-sched/gavel/pkg/etcdx"

// Key layout the rep writes in etcd. It is part of the BBS's layout (see
// services/bbs/internal/store/keys.go, which reads these keys), under the same versioned root:
//
//	/gavel/v1/cell/<cell_id>    CellPresence (binary protobuf), attached to the rep's lease
const (
	// CellPrefix is the prefix of every cell's presence key.
	CellPrefix = etcdx.Root + "cell/"
)

// CellKey is the key of a cell's presence.
func CellKey(cellID string) string { return CellPrefix + cellID }
