package store

import (
	"github.com/gavel-sched/gavel/pkg/layout"
	"github.com/gavel-sched/gavel/pkg/sealing"
)

// LayoutVersion is the version of the BBS's key layout this code reads and writes (the layout
// key is layout.Key(LayoutService)):
//
//	1  the releases before versioning: the keys of keys.go, every record clear
//	2  run infos and tasks may be sealed envelopes (pkg/sealing); with encryption on, none is clear
//
// A BBS refuses a store at a newer version, which it could misread.
const LayoutVersion = 2

// LayoutService names the BBS's layout key and migration lock.
const LayoutService = "bbs"

// Migrations are the BBS's layout migrations from layout.Base to LayoutVersion, in order.
// Version 2 seals, under keyring's active key, the run infos and tasks a release before
// encryption stored clear (nothing to do with encryption off).
func Migrations(keyring *sealing.Keyring) []layout.Migration {
	return []layout.Migration{
		layout.SealClear(2, keyring, desiredRunPrefix, taskPrefix),
	}
}
