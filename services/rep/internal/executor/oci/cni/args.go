package cni

import (
	"sort"
	"strings"
)

// PropertiesCapability is the capability argument that carries the work's properties, a JSON
// object of string to string, in the runtimeConfig of every plugin whose configuration
// declares "capabilities": {"io.gavel.properties": true}. It is named like containerd's
// "io.kubernetes.cri.pod-annotations".
const PropertiesCapability = "io.gavel.properties"

// MaxCNIArgs bounds the length of CNI_ARGS: the environment variable must stay well under
// Linux's 128 KiB limit on one environment string.
const MaxCNIArgs = 64 << 10

// reservedArgs are CNI_ARGS keys the reference plugins read (host-local and static take IP
// and GATEWAY, bridge and tuning MAC, several the K8S_ ones); a property of that name would
// change how the container is networked, so it never goes to CNI_ARGS.
var reservedArgs = map[string]bool{
	"IgnoreUnknown":              true,
	"IP":                         true,
	"MAC":                        true,
	"GATEWAY":                    true,
	"K8S_POD_NAME":               true,
	"K8S_POD_NAMESPACE":          true,
	"K8S_POD_INFRA_CONTAINER_ID": true,
	"K8S_POD_UID":                true,
}

// CNIArgs returns the CNI_ARGS pairs for props: "IgnoreUnknown=1" first (the reference
// plugins refuse unknown keys without it), then the properties sorted by key. CNI_ARGS is
// "K=V;K=V" with no escaping, so a property is skipped, and its key returned in skipped
// (sorted), when its key is empty or reserved, when its key or value holds ';', '=' or NUL,
// or when adding it would make CNI_ARGS longer than MaxCNIArgs. Values are never altered:
// a plugin reads from CNI_ARGS exactly the property or nothing.
func CNIArgs(props map[string]string) (args [][2]string, skipped []string) {
	keys := make([]string, 0, len(props))
	for k := range props {
		keys = append(keys, k)
	}
	sort.Strings(keys)
	args = [][2]string{{"IgnoreUnknown", "1"}}
	size := len("IgnoreUnknown=1")
	for _, k := range keys {
		v := props[k]
		if k == "" || reservedArgs[k] || strings.ContainsAny(k, ";=\x00") || strings.ContainsAny(v, ";=\x00") ||
			size+1+len(k)+1+len(v) > MaxCNIArgs {
			skipped = append(skipped, k)
			continue
		}
		args = append(args, [2]string{k, v})
		size += 1 + len(k) + 1 + len(v)
	}
	return args, skipped
}
