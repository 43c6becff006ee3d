package store

import (
	"strings"

	"github.com/gavel-sched/gavel/pkg/etcdx"
)

// Root is the prefix of every key nsync writes. nsync's records are its own: the BBS never
// reads them, and nsync reads the BBS's only through its API.
const Root = etcdx.Root + "nsync/"

// Key layout (values are binary protobuf unless noted):
//
//	/gavel/v1/nsync/app/<app_guid>               nsyncv1.AppRecord
//	/gavel/v1/nsync/pool/<name>                  nsyncv1.PlacementPool
//	/gavel/v1/nsync/space/<space_guid>           the bound pool's name (raw bytes)
//	/gavel/v1/nsync/binding/<pool>/<space_guid>  empty: the reverse index of space/, so that
//	                                             deleting a pool can compare "no binding" in
//	                                             its transaction
//	/gavel/v1/nsync/default                      the default pool's name (raw bytes)
//
// The bulk loop's election lives under etcdx.LockKey("nsync").
const (
	appPrefix     = Root + "app/"
	poolPrefix    = Root + "pool/"
	spacePrefix   = Root + "space/"
	bindingPrefix = Root + "binding/"
	defaultKey    = Root + "default"
)

func appKey(guid string) string  { return appPrefix + guid }
func poolKey(name string) string { return poolPrefix + name }
func spaceKey(space string) string {
	return spacePrefix + space
}
func bindingKey(pool, space string) string { return bindingPrefix + pool + "/" + space }
func poolBindings(pool string) string      { return bindingPrefix + pool + "/" }

// spaceOf is the space guid of a binding key under poolBindings(pool).
func spaceOf(pool, key string) string { return strings.TrimPrefix(key, poolBindings(pool)) }
