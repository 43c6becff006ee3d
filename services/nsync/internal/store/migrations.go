package store

import (
	"github.com/gavel-sched/gavel/pkg/layout"
	"github.com/gavel-sched/gavel/pkg/sealing"
)

// LayoutVersion is the version of nsync's key layout this code reads and writes (the layout
// key is layout.Key(LayoutService)):
//
//	1  the releases before versioning: the keys of keys.go, every record clear
//	2  app records may be sealed envelopes (pkg/sealing); with encryption on, none is clear
const LayoutVersion = 2

// LayoutService names nsync's layout key and migration lock.
const LayoutService = "nsync"

// Migrations are nsync's layout migrations from layout.Base to LayoutVersion, in order.
// Version 2 seals the app records a release before encryption stored clear.
func Migrations(keyring *sealing.Keyring) []layout.Migration {
	return []layout.Migration{layout.SealClear(2, keyring, appPrefix)}
}
