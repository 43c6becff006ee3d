package models

import (
	"encoding/json"
	"errors"
	"fmt"
	"net"
	"net/url"
	"regexp"
	"slices"
	"strconv"
	"strings"
	"unicode"
	"unicode/utf8"

	modelsv1 "github.com/gavel-sched/gavel/pkg/gen/gavel/models/v1"
	"github.com/gavel-sched/gavel/pkg/labels"
	"github.com/gavel-sched/gavel/pkg/routing/cfrouter"
	"github.com/gavel-sched/gavel/pkg/rpcerr"
)

// Structural limits that are not configurable.
const (
	// MaxNameLength is the longest guid, domain or cell id.
	MaxNameLength = 128
	// MaxTagLength bounds placement tags: a tag must be shorter than this many characters.
	MaxTagLength = 64
	// MaxPorts is the largest number of container ports a DesiredLRP may expose.
	MaxPorts = 20
	// MaxActionDepth is the deepest an action tree may nest, counting the root as level 1.
	MaxActionDepth = 32
	// MaxCPUWeight is the largest cpu_weight.
	MaxCPUWeight = 100
)

// Field path helpers. Paths use protobuf field names: "a.b", "a.b[2]", `a.b["k"]`.

func sub(prefix, name string) string {
	if prefix == "" {
		return name
	}
	return prefix + "." + name
}

func idx(field string, i int) string { return field + "[" + strconv.Itoa(i) + "]" }

func key(field, k string) string { return field + "[" + strconv.Quote(k) + "]" }

func sortedKeys[V any](m map[string]V) []string {
	keys := make([]string, 0, len(m))
	for k := range m {
		keys = append(keys, k)
	}
	slices.Sort(keys)
	return keys
}

func hasSpace(s string) bool { return strings.IndexFunc(s, unicode.IsSpace) >= 0 }

// ValidateGuid checks a process or task guid: 1-128 characters of letters, digits, '-' and '_'.
func ValidateGuid(field, s string) error {
	e := &rpcerr.InvalidError{}
	checkGuid(e, field, s)
	return e.Err()
}

// ValidateDomain checks a domain name: 1-128 characters of letters, digits, '-', '_' and '.'.
func ValidateDomain(field, s string) error {
	e := &rpcerr.InvalidError{}
	checkDomain(e, field, s)
	return e.Err()
}

// ValidateCellID checks a cell id: 1-128 characters of letters, digits, '-', '_' and '.'.
func ValidateCellID(field, s string) error {
	e := &rpcerr.InvalidError{}
	checkDomain(e, field, s)
	return e.Err()
}

func isGuidChar(r rune) bool {
	return r >= 'a' && r <= 'z' || r >= 'A' && r <= 'Z' || r >= '0' && r <= '9' || r == '-' || r == '_'
}

func isDomainChar(r rune) bool { return isGuidChar(r) || r == '.' }

func checkGuid(e *rpcerr.InvalidError, field, s string) {
	checkName(e, field, s, isGuidChar, "letters, digits, '-' and '_'")
}

func checkDomain(e *rpcerr.InvalidError, field, s string) {
	checkName(e, field, s, isDomainChar, "letters, digits, '-', '_' and '.'")
}

func checkName(e *rpcerr.InvalidError, field, s string, ok func(rune) bool, allowed string) {
	if s == "" {
		e.Add(field, "is required")
		return
	}
	if len(s) > MaxNameLength {
		e.Add(field, "must be at most %d characters, got %d", MaxNameLength, len(s))
	}
	for i, r := range s {
		if !ok(r) {
			e.Add(field, "contains %q at offset %d; only %s are allowed", r, i, allowed)
			return
		}
	}
}

// ValidateInstanceKey checks an instance key: both instance_guid and cell_id are required and
// well formed.
func ValidateInstanceKey(field string, k *modelsv1.ActualLRPInstanceKey) error {
	e := &rpcerr.InvalidError{}
	checkInstanceKey(e, field, k)
	return e.Err()
}

func checkInstanceKey(e *rpcerr.InvalidError, field string, k *modelsv1.ActualLRPInstanceKey) {
	if k == nil {
		e.Add(field, "is required")
		return
	}
	checkGuid(e, sub(field, "instance_guid"), k.GetInstanceGuid())
	checkDomain(e, sub(field, "cell_id"), k.GetCellId())
}

// ValidateNetInfo checks the network information of a running instance: it is required and
// every container and host port is in 1..65535.
func ValidateNetInfo(field string, n *modelsv1.ActualLRPNetInfo) error {
	e := &rpcerr.InvalidError{}
	checkNetInfo(e, field, n)
	return e.Err()
}

func checkNetInfo(e *rpcerr.InvalidError, field string, n *modelsv1.ActualLRPNetInfo) {
	if n == nil {
		e.Add(field, "is required")
		return
	}
	for i, p := range n.GetPorts() {
		pf := idx(sub(field, "ports"), i)
		checkPort(e, sub(pf, "container_port"), p.GetContainerPort())
		checkPort(e, sub(pf, "host_port"), p.GetHostPort())
	}
}

func checkPort(e *rpcerr.InvalidError, field string, p uint32) {
	if p < 1 || p > 65535 {
		e.Add(field, "must be between 1 and 65535, got %d", p)
	}
}

// ValidatePlacementError checks a placement error: it is required, its code is a known code
// other than CODE_UNSPECIFIED and its message is not empty.
func ValidatePlacementError(field string, pe *modelsv1.PlacementError) error {
	e := &rpcerr.InvalidError{}
	checkPlacementError(e, field, pe)
	return e.Err()
}

func checkPlacementError(e *rpcerr.InvalidError, field string, pe *modelsv1.PlacementError) {
	if pe == nil {
		e.Add(field, "is required")
		return
	}
	code := pe.GetCode()
	if code == modelsv1.PlacementError_CODE_UNSPECIFIED {
		e.Add(sub(field, "code"), "is required")
	} else if _, known := modelsv1.PlacementError_Code_name[int32(code)]; !known {
		e.Add(sub(field, "code"), "is not a known placement error code: %d", code)
	}
	if pe.GetMessage() == "" {
		e.Add(sub(field, "message"), "is required")
	}
}

// ValidateRootfs checks a rootfs URI: it is required and has a scheme naming its provider and a
// non-empty rest, e.g. "preloaded:cflinuxfs4", "preloaded://cflinuxfs4",
// "docker:///library/redis#7".
func ValidateRootfs(field, s string) error {
	e := &rpcerr.InvalidError{}
	checkRootfs(e, field, s)
	return e.Err()
}

func checkRootfs(e *rpcerr.InvalidError, field, s string) {
	if _, err := ParseRootfs(s); err != nil {
		e.Add(field, "%s", err.Error())
	}
}

// maxImageCredential bounds image_username and image_password.
const maxImageCredential = 4096

// checkImageCredentials checks a registry user name and password: both or neither, only with a
// docker:// rootfs, bounded. A violation names the field, never the value.
func checkImageCredentials(e *rpcerr.InvalidError, prefix, rootfs, user, password string) {
	if user == "" && password == "" {
		return
	}
	switch {
	case user == "":
		e.Add(sub(prefix, "image_username"), "is required with image_password")
	case password == "":
		e.Add(sub(prefix, "image_password"), "is required with image_username")
	}
	if r, err := ParseRootfs(rootfs); err == nil && r.Scheme != RootfsDocker {
		e.Add(sub(prefix, "image_username"), "is only for a docker:// rootfs, got a %s: rootfs", r.Scheme)
	}
	if len(user) > maxImageCredential {
		e.Add(sub(prefix, "image_username"), "must be at most %d bytes", maxImageCredential)
	}
	if len(password) > maxImageCredential {
		e.Add(sub(prefix, "image_password"), "must be at most %d bytes", maxImageCredential)
	}
}

// ValidatePlacementTag checks one placement tag: not empty, shorter than 64 characters, without
// commas or whitespace.
func ValidatePlacementTag(field, tag string) error {
	e := &rpcerr.InvalidError{}
	checkTag(e, field, tag)
	return e.Err()
}

func checkTag(e *rpcerr.InvalidError, field, tag string) {
	if tag == "" {
		e.Add(field, "must not be empty")
		return
	}
	if n := utf8.RuneCountInString(tag); n >= MaxTagLength {
		e.Add(field, "must be shorter than %d characters, got %d", MaxTagLength, n)
	}
	if strings.ContainsRune(tag, ',') {
		e.Add(field, "must not contain commas")
	}
	if hasSpace(tag) {
		e.Add(field, "must not contain whitespace")
	}
}

// ValidatePlacementConstraint checks an optional placement constraint: every required and
// disallowed tag is a valid placement tag.
func ValidatePlacementConstraint(field string, c *modelsv1.PlacementConstraint) error {
	e := &rpcerr.InvalidError{}
	checkConstraint(e, field, c)
	return e.Err()
}

func checkConstraint(e *rpcerr.InvalidError, field string, c *modelsv1.PlacementConstraint) {
	for i, t := range c.GetRequire() {
		checkTag(e, idx(sub(field, "require"), i), t)
	}
	for i, t := range c.GetDisallow() {
		checkTag(e, idx(sub(field, "disallow"), i), t)
	}
}

// ValidateLabels checks every key and value of a labels map with labels.ValidateKey and
// labels.ValidateValue.
func ValidateLabels(field string, m map[string]string) error {
	e := &rpcerr.InvalidError{}
	checkLabels(e, field, m)
	return e.Err()
}

func checkLabels(e *rpcerr.InvalidError, field string, m map[string]string) {
	for _, k := range sortedKeys(m) {
		if err := labels.ValidateKey(k); err != nil {
			e.Add(key(field, k), "%v", err)
		}
		if err := labels.ValidateValue(m[k]); err != nil {
			e.Add(key(field, k), "%v", err)
		}
	}
}

// ValidateRoutes checks a routes map: provider names are not empty, every document is valid JSON,
// the cf-router document (the provider Gavel serves) follows its schema, and the documents
// together fit l.MaxRouteBytes. Other providers' documents are opaque.
func ValidateRoutes(field string, m map[string][]byte, l Limits) error {
	e := &rpcerr.InvalidError{}
	checkRoutes(e, field, m, l.withDefaults())
	return e.Err()
}

func checkRoutes(e *rpcerr.InvalidError, field string, m map[string][]byte, l Limits) {
	total := 0
	for _, k := range sortedKeys(m) {
		v := m[k]
		total += len(v)
		if k == "" {
			e.Add(key(field, k), "provider name must not be empty")
		}
		if !json.Valid(v) {
			e.Add(key(field, k), "must be a valid JSON document")
			continue
		}
		// Gavel serves the cf-router provider itself: its document must parse, so a mistake
		// is refused here rather than dropped later by the route-emitter.
		if k == cfrouter.Provider {
			checkCFRouter(e, key(field, k), v, l)
		}
	}
	if total > l.MaxRouteBytes {
		e.Add(field, "route documents total %d bytes, more than the limit of %d", total, l.MaxRouteBytes)
	}
}

// checkCFRouter parses a cf-router document and checks its TCP/UDP incoming ports against the
// allowed range.
func checkCFRouter(e *rpcerr.InvalidError, field string, doc []byte, l Limits) {
	entries, err := cfrouter.Parse(doc)
	if err != nil {
		var pe *cfrouter.Error
		if errors.As(err, &pe) {
			e.Add(field+pe.Path(), "%s", pe.Reason)
		} else {
			e.Add(field, "%v", err)
		}
		return
	}
	if l.IncomingPortMax == 0 {
		return
	}
	for i, en := range entries {
		if en.IncomingPort != 0 && (en.IncomingPort < l.IncomingPortMin || en.IncomingPort > l.IncomingPortMax) {
			e.Add(idx(field, i)+".incoming_port", "%d is outside the allowed incoming port range %d-%d",
				en.IncomingPort, l.IncomingPortMin, l.IncomingPortMax)
		}
	}
}

func checkProperties(e *rpcerr.InvalidError, field string, m map[string]string, l Limits) {
	total := 0
	for _, k := range sortedKeys(m) {
		total += len(k) + len(m[k])
		if k == "" {
			e.Add(key(field, k), "key must not be empty")
		}
	}
	if total > l.MaxPropertyBytes {
		e.Add(field, "keys and values total %d bytes, more than the limit of %d", total, l.MaxPropertyBytes)
	}
}

func checkAnnotation(e *rpcerr.InvalidError, field, s string, l Limits) {
	if len(s) > l.MaxAnnotationBytes {
		e.Add(field, "is %d bytes, more than the limit of %d", len(s), l.MaxAnnotationBytes)
	}
}

func checkNonNegative(e *rpcerr.InvalidError, field string, v int64) {
	if v < 0 {
		e.Add(field, "must not be negative, got %d", v)
	}
}

func checkPorts(e *rpcerr.InvalidError, field string, ports []uint32) {
	if len(ports) > MaxPorts {
		e.Add(field, "must have at most %d ports, got %d", MaxPorts, len(ports))
	}
	first := make(map[uint32]int, len(ports))
	for i, p := range ports {
		checkPort(e, idx(field, i), p)
		if j, dup := first[p]; dup {
			e.Add(idx(field, i), "duplicates port %d of %s", p, idx(field, j))
			continue
		}
		first[p] = i
	}
}

func checkEnv(e *rpcerr.InvalidError, field string, env []*modelsv1.EnvironmentVariable) {
	for i, v := range env {
		name := v.GetName()
		nf := sub(idx(field, i), "name")
		if name == "" {
			e.Add(nf, "is required")
		} else if strings.ContainsRune(name, '=') {
			e.Add(nf, "must not contain '='")
		}
	}
}

func checkCPUWeight(e *rpcerr.InvalidError, field string, w uint32) {
	if w > MaxCPUWeight {
		e.Add(field, "must be at most %d, got %d", MaxCPUWeight, w)
	}
}

// checkAction validates an action tree; depth is the level of a, the root being level 1.
func checkAction(e *rpcerr.InvalidError, field string, a *modelsv1.Action, depth int) {
	if a == nil {
		e.Add(field, "is required")
		return
	}
	if depth > MaxActionDepth {
		e.Add(field, "nests deeper than %d levels", MaxActionDepth)
		return
	}
	switch k := a.GetKind().(type) {
	case *modelsv1.Action_Run:
		f := sub(field, "run")
		if k.Run.GetPath() == "" {
			e.Add(sub(f, "path"), "is required")
		}
		checkEnv(e, sub(f, "env"), k.Run.GetEnv())
	case *modelsv1.Action_Download:
		f := sub(field, "download")
		d := k.Download
		if d.GetFrom() == "" {
			e.Add(sub(f, "from"), "is required")
		}
		if d.GetTo() == "" {
			e.Add(sub(f, "to"), "is required")
		}
		checkChecksum(e, f, d.GetChecksumAlgorithm(), d.GetChecksumValue())
	case *modelsv1.Action_Serial:
		checkChildren(e, sub(sub(field, "serial"), "actions"), k.Serial.GetActions(), depth)
	case *modelsv1.Action_Parallel:
		checkChildren(e, sub(sub(field, "parallel"), "actions"), k.Parallel.GetActions(), depth)
	case *modelsv1.Action_Codependent:
		checkChildren(e, sub(sub(field, "codependent"), "actions"), k.Codependent.GetActions(), depth)
	case *modelsv1.Action_Try:
		checkAction(e, sub(sub(field, "try"), "action"), k.Try.GetAction(), depth+1)
	case *modelsv1.Action_Timeout:
		f := sub(field, "timeout")
		checkAction(e, sub(f, "action"), k.Timeout.GetAction(), depth+1)
		if ms := k.Timeout.GetTimeoutMs(); ms <= 0 {
			e.Add(sub(f, "timeout_ms"), "must be positive, got %d", ms)
		}
	default:
		e.Add(field, "must set one of run, download, serial, parallel, codependent, try or timeout")
	}
}

func checkChildren(e *rpcerr.InvalidError, field string, actions []*modelsv1.Action, depth int) {
	if len(actions) == 0 {
		e.Add(field, "must have at least one action")
		return
	}
	for i, c := range actions {
		checkAction(e, idx(field, i), c, depth+1)
	}
}

func checkChecksum(e *rpcerr.InvalidError, field, algorithm, value string) {
	switch {
	case algorithm == "" && value == "":
	case algorithm == "":
		e.Add(sub(field, "checksum_algorithm"), "is required when checksum_value is set")
	case algorithm != "sha256" && algorithm != "sha1":
		e.Add(sub(field, "checksum_algorithm"), "must be sha256 or sha1, got %q", algorithm)
	case value == "":
		e.Add(sub(field, "checksum_value"), "is required when checksum_algorithm is set")
	}
}

func checkCheckDefinition(e *rpcerr.InvalidError, field string, cd *modelsv1.CheckDefinition) {
	for i, c := range cd.GetChecks() {
		checkCheck(e, idx(sub(field, "checks"), i), c)
	}
	for i, c := range cd.GetReadinessChecks() {
		checkCheck(e, idx(sub(field, "readiness_checks"), i), c)
	}
}

func checkCheck(e *rpcerr.InvalidError, field string, c *modelsv1.Check) {
	switch k := c.GetKind().(type) {
	case *modelsv1.Check_Tcp:
		f := sub(field, "tcp")
		checkPort(e, sub(f, "port"), k.Tcp.GetPort())
		checkNonNegative(e, sub(f, "connect_timeout_ms"), k.Tcp.GetConnectTimeoutMs())
		checkNonNegative(e, sub(f, "interval_ms"), k.Tcp.GetIntervalMs())
	case *modelsv1.Check_Http:
		f := sub(field, "http")
		checkPort(e, sub(f, "port"), k.Http.GetPort())
		if p := k.Http.GetPath(); p != "" && !strings.HasPrefix(p, "/") {
			e.Add(sub(f, "path"), "must start with '/', got %q", p)
		}
		checkNonNegative(e, sub(f, "request_timeout_ms"), k.Http.GetRequestTimeoutMs())
		checkNonNegative(e, sub(f, "interval_ms"), k.Http.GetIntervalMs())
	default:
		e.Add(field, "must set one of tcp or http")
	}
}

func checkLinks(e *rpcerr.InvalidError, field string, l *modelsv1.Links) {
	provides := sub(field, "provides")
	seen := map[string]int{}
	for i, p := range l.GetProvides() {
		f := idx(provides, i)
		checkLinkName(e, sub(f, "name"), p.GetName(), seen, provides, i)
		if p.GetType() == "" {
			e.Add(sub(f, "type"), "is required")
		}
		if p.GetPort() > 65535 {
			e.Add(sub(f, "port"), "must be between 1 and 65535, got %d", p.GetPort())
		}
	}
	consumes := sub(field, "consumes")
	seen = map[string]int{}
	for i, c := range l.GetConsumes() {
		f := idx(consumes, i)
		checkLinkName(e, sub(f, "name"), c.GetName(), seen, consumes, i)
		switch c.GetNetwork() {
		case "", "host", "instance":
		default:
			e.Add(sub(f, "network"), "must be empty, \"host\" or \"instance\", got %q", c.GetNetwork())
		}
		if c.GetFrom() == "" && c.GetType() == "" && c.GetCustom() == nil {
			e.Add(f, "must set from, type or custom to find its provider")
		}
	}
}

func checkLinkName(e *rpcerr.InvalidError, field, name string, seen map[string]int, list string, i int) {
	if name == "" {
		e.Add(field, "is required")
		return
	}
	if j, dup := seen[name]; dup {
		e.Add(field, "duplicates the name %q of %s", name, idx(list, j))
		return
	}
	seen[name] = i
	// A consumed link's name names its file in the container, so it must be a plain name.
	if !linkNameRE.MatchString(name) {
		e.Add(field, "must be letters, digits, '-', '_' and '.', not starting with '.', got %q", name)
	}
}

var linkNameRE = regexp.MustCompile(`^[A-Za-z0-9_-][A-Za-z0-9_.-]{0,127}$`)

func checkCallbackURL(e *rpcerr.InvalidError, field, s string) {
	if s == "" {
		return
	}
	u, err := url.Parse(s)
	if err != nil || (u.Scheme != "http" && u.Scheme != "https") || u.Host == "" {
		e.Add(field, "must be an absolute http or https URL, got %q", s)
	}
}

// ValidateDesiredLRP checks a DesiredLRP about to be desired. prefix is the path of d itself,
// e.g. "desired_lrp"; every violation is listed.
func ValidateDesiredLRP(prefix string, d *modelsv1.DesiredLRP, l Limits) error {
	e := &rpcerr.InvalidError{}
	if d == nil {
		e.Add(prefix, "is required")
		return e.Err()
	}
	l = l.withDefaults()
	checkGuid(e, sub(prefix, "process_guid"), d.GetProcessGuid())
	checkDomain(e, sub(prefix, "domain"), d.GetDomain())
	checkRootfs(e, sub(prefix, "rootfs"), d.GetRootfs())
	checkImageCredentials(e, prefix, d.GetRootfs(), d.GetImageUsername(), d.GetImagePassword())
	if n := d.GetInstances(); n < 0 || n > l.MaxInstances {
		e.Add(sub(prefix, "instances"), "must be between 0 and %d, got %d", l.MaxInstances, n)
	}
	checkNonNegative(e, sub(prefix, "memory_mb"), int64(d.GetMemoryMb()))
	checkNonNegative(e, sub(prefix, "disk_mb"), int64(d.GetDiskMb()))
	checkNonNegative(e, sub(prefix, "max_pids"), int64(d.GetMaxPids()))
	checkConstraint(e, sub(prefix, "placement_constraint"), d.GetPlacementConstraint())
	checkProperties(e, sub(prefix, "properties"), d.GetProperties(), l)
	checkLabels(e, sub(prefix, "labels"), d.GetLabels())
	checkAnnotation(e, sub(prefix, "annotation"), d.GetAnnotation(), l)
	checkRoutes(e, sub(prefix, "routes"), d.GetRoutes(), l)
	checkPorts(e, sub(prefix, "ports"), d.GetPorts())
	checkEnv(e, sub(prefix, "env"), d.GetEnv())
	if d.GetSetup() != nil {
		checkAction(e, sub(prefix, "setup"), d.GetSetup(), 1)
	}
	checkAction(e, sub(prefix, "action"), d.GetAction(), 1)
	if d.GetMonitor() != nil {
		checkAction(e, sub(prefix, "monitor"), d.GetMonitor(), 1)
	}
	checkCheckDefinition(e, sub(prefix, "check_definition"), d.GetCheckDefinition())
	checkNonNegative(e, sub(prefix, "start_timeout_ms"), d.GetStartTimeoutMs())
	checkLinks(e, sub(prefix, "links"), d.GetLinks())
	checkCPUWeight(e, sub(prefix, "cpu_weight"), d.GetCpuWeight())
	checkLogDrains(e, sub(prefix, "log_drains"), d.GetLogDrains())
	checkSpreadWith(e, sub(prefix, "spread_with"), d.GetProcessGuid(), d.GetSpreadWith(), l)
	return e.Err()
}

// checkSpreadWith checks a spread peer of the LRP self (nil is none): a valid process guid
// other than self, and a total instance count within the instance limit.
func checkSpreadWith(e *rpcerr.InvalidError, field, self string, s *modelsv1.SpreadWith, l Limits) {
	if s == nil {
		return
	}
	pg := s.GetProcessGuid()
	checkGuid(e, sub(field, "process_guid"), pg)
	if pg != "" && pg == self {
		e.Add(sub(field, "process_guid"), "must name another desired LRP, got the LRP's own %q", pg)
	}
	if n := s.GetTotalInstances(); n < 0 || n > l.MaxInstances {
		e.Add(sub(field, "total_instances"), "must be between 0 and %d, got %d", l.MaxInstances, n)
	}
}

// ValidateDesiredLRPUpdate checks the mutable fields of an update: instances when set, routes,
// labels, annotation and spread peer. Immutable fields are compared with the stored LRP by
// CheckImmutable. A spread peer naming the LRP itself is refused by CheckImmutable, which knows
// the LRP.
func ValidateDesiredLRPUpdate(prefix string, u *modelsv1.DesiredLRPUpdate, l Limits) error {
	e := &rpcerr.InvalidError{}
	if u == nil {
		e.Add(prefix, "is required")
		return e.Err()
	}
	l = l.withDefaults()
	if u.Instances != nil {
		if n := u.GetInstances(); n < 0 || n > l.MaxInstances {
			e.Add(sub(prefix, "instances"), "must be between 0 and %d, got %d", l.MaxInstances, n)
		}
	}
	if u.GetRoutes() != nil {
		checkRoutes(e, sub(sub(prefix, "routes"), "routes"), u.GetRoutes().GetRoutes(), l)
	}
	if u.Annotation != nil {
		checkAnnotation(e, sub(prefix, "annotation"), u.GetAnnotation(), l)
	}
	if u.GetLabels() != nil {
		checkLabels(e, sub(sub(prefix, "labels"), "labels"), u.GetLabels().GetLabels())
	}
	if u.GetSpreadWith() != nil {
		checkSpreadWith(e, sub(sub(prefix, "spread_with"), "spread_with"), "", u.GetSpreadWith().GetSpreadWith(), l)
	}
	if u.GetLogDrains() != nil {
		checkLogDrains(e, sub(sub(prefix, "log_drains"), "log_drains"), u.GetLogDrains().GetLogDrains())
	}
	return e.Err()
}

// CheckImmutable reports an update that sets rootfs, ports or placement_constraint to anything
// but the stored value, and a spread peer naming the stored LRP itself. Placement constraints
// compare case-insensitively as sets of tags.
func CheckImmutable(prefix string, stored *modelsv1.DesiredLRP, u *modelsv1.DesiredLRPUpdate) error {
	e := &rpcerr.InvalidError{}
	if u == nil {
		return nil
	}
	if u.Rootfs != nil && !sameRootfs(u.GetRootfs(), stored.GetRootfs()) {
		e.Add(sub(prefix, "rootfs"), "is immutable: stored %q, got %q", stored.GetRootfs(), u.GetRootfs())
	}
	if u.GetPorts() != nil && !slices.Equal(u.GetPorts().GetPorts(), stored.GetPorts()) {
		e.Add(sub(prefix, "ports"), "is immutable: stored %v, got %v", stored.GetPorts(), u.GetPorts().GetPorts())
	}
	if c := u.GetPlacementConstraint(); c != nil && !SameConstraint(c, stored.GetPlacementConstraint()) {
		e.Add(sub(prefix, "placement_constraint"), "is immutable: stored %s, got %s",
			formatConstraint(stored.GetPlacementConstraint()), formatConstraint(c))
	}
	if pg := u.GetSpreadWith().GetSpreadWith().GetProcessGuid(); pg != "" && pg == stored.GetProcessGuid() {
		e.Add(sub(sub(sub(prefix, "spread_with"), "spread_with"), "process_guid"), "must name another desired LRP, got the LRP's own %q", pg)
	}
	return e.Err()
}

// SameConstraint reports whether two placement constraints require and disallow the same tags,
// compared case-insensitively as sets. A nil constraint equals an empty one.
func SameConstraint(a, b *modelsv1.PlacementConstraint) bool {
	return slices.Equal(tagSet(a.GetRequire()), tagSet(b.GetRequire())) &&
		slices.Equal(tagSet(a.GetDisallow()), tagSet(b.GetDisallow()))
}

// tagSet returns the lower-cased, sorted, de-duplicated tags.
func tagSet(tags []string) []string {
	out := make([]string, len(tags))
	for i, t := range tags {
		out[i] = strings.ToLower(t)
	}
	slices.Sort(out)
	return slices.Compact(out)
}

func formatConstraint(c *modelsv1.PlacementConstraint) string {
	return fmt.Sprintf("{require: %q, disallow: %q}", tagSet(c.GetRequire()), tagSet(c.GetDisallow()))
}

// ValidateTaskDefinition checks a task definition about to be desired. prefix is the path of def
// itself, e.g. "definition".
func ValidateTaskDefinition(prefix string, def *modelsv1.TaskDefinition, l Limits) error {
	e := &rpcerr.InvalidError{}
	if def == nil {
		e.Add(prefix, "is required")
		return e.Err()
	}
	l = l.withDefaults()
	checkRootfs(e, sub(prefix, "rootfs"), def.GetRootfs())
	checkImageCredentials(e, prefix, def.GetRootfs(), def.GetImageUsername(), def.GetImagePassword())
	checkAction(e, sub(prefix, "action"), def.GetAction(), 1)
	checkNonNegative(e, sub(prefix, "memory_mb"), int64(def.GetMemoryMb()))
	checkNonNegative(e, sub(prefix, "disk_mb"), int64(def.GetDiskMb()))
	checkNonNegative(e, sub(prefix, "max_pids"), int64(def.GetMaxPids()))
	checkCPUWeight(e, sub(prefix, "cpu_weight"), def.GetCpuWeight())
	checkConstraint(e, sub(prefix, "placement_constraint"), def.GetPlacementConstraint())
	checkProperties(e, sub(prefix, "properties"), def.GetProperties(), l)
	checkLabels(e, sub(prefix, "labels"), def.GetLabels())
	checkCallbackURL(e, sub(prefix, "completion_callback_url"), def.GetCompletionCallbackUrl())
	checkAnnotation(e, sub(prefix, "annotation"), def.GetAnnotation(), l)
	checkEnv(e, sub(prefix, "env"), def.GetEnv())
	checkNonNegative(e, sub(prefix, "max_rejections"), int64(def.GetMaxRejections()))
	checkLogDrains(e, sub(prefix, "log_drains"), def.GetLogDrains())
	return e.Err()
}

// ValidateCellPresence checks a rep's registration: a valid cell id, a host:port rep address,
// a non-negative capacity, valid placement tags, named preloaded rootfses with paths and
// well-formed provider schemes.
func ValidateCellPresence(field string, c *modelsv1.CellPresence) error {
	e := &rpcerr.InvalidError{}
	if c == nil {
		e.Add(field, "is required")
		return e.Err()
	}
	checkDomain(e, sub(field, "cell_id"), c.GetCellId())
	checkHostPort(e, sub(field, "rep_address"), c.GetRepAddress())
	if capa := c.GetCapacity(); capa == nil {
		e.Add(sub(field, "capacity"), "is required")
	} else {
		f := sub(field, "capacity")
		checkNonNegative(e, sub(f, "memory_mb"), int64(capa.GetMemoryMb()))
		checkNonNegative(e, sub(f, "disk_mb"), int64(capa.GetDiskMb()))
		checkNonNegative(e, sub(f, "containers"), int64(capa.GetContainers()))
	}
	for i, t := range c.GetPlacementTags() {
		checkTag(e, idx(sub(field, "placement_tags"), i), t)
	}
	for _, name := range sortedKeys(c.GetPreloadedRootfses()) {
		f := key(sub(field, "preloaded_rootfses"), name)
		if name == "" || hasSpace(name) {
			e.Add(f, "name must be non-empty and without whitespace")
		}
		if c.GetPreloadedRootfses()[name] == "" {
			e.Add(f, "path is required")
		}
	}
	for i, p := range c.GetRootfsProviders() {
		if !isScheme(p) {
			e.Add(idx(sub(field, "rootfs_providers"), i), "must be a URI scheme (a letter, then letters, digits, '+', '-' or '.'), got %q", p)
		}
	}
	return e.Err()
}

func checkHostPort(e *rpcerr.InvalidError, field, s string) {
	if s == "" {
		e.Add(field, "is required")
		return
	}
	host, port, err := net.SplitHostPort(s)
	if err != nil {
		e.Add(field, "must be host:port: %v", err)
		return
	}
	if n, err := strconv.ParseUint(port, 10, 16); err != nil || n == 0 || host == "" {
		e.Add(field, "must be host:port with a port between 1 and 65535, got %q", s)
	}
}

func isScheme(s string) bool {
	if s == "" {
		return false
	}
	for i, r := range s {
		letter := r >= 'a' && r <= 'z' || r >= 'A' && r <= 'Z'
		if i == 0 && !letter {
			return false
		}
		if !letter && !(r >= '0' && r <= '9') && r != '+' && r != '-' && r != '.' {
			return false
		}
	}
	return true
}

// sameRootfs reports whether two rootfs URIs name the same root filesystem.
func sameRootfs(a, b string) bool {
	ca, errA := CanonicalRootfs(a)
	cb, errB := CanonicalRootfs(b)
	if errA != nil || errB != nil {
		return a == b
	}
	return ca == cb
}

// MaxLogDrains bounds an LRP's syslog drains.
const MaxLogDrains = 8

// checkLogDrains checks syslog drain URLs: syslog:// or syslog-tls://, with a host and a port.
func checkLogDrains(e *rpcerr.InvalidError, field string, drains []string) {
	if len(drains) > MaxLogDrains {
		e.Add(field, "has %d drains, at most %d", len(drains), MaxLogDrains)
	}
	for i, d := range drains {
		f := fmt.Sprintf("%s[%d]", field, i)
		u, err := url.Parse(d)
		switch {
		case err != nil:
			e.Add(f, "is not a URL: %v", err)
		case u.Scheme != "syslog" && u.Scheme != "syslog-tls":
			e.Add(f, "must be a syslog:// or syslog-tls:// URL, got %q", d)
		case u.Hostname() == "" || u.Port() == "":
			e.Add(f, "must name a host and a port, e.g. syslog-tls://logs.example.com:6514, got %q", d)
		case u.Path != "" && u.Path != "/" || u.RawQuery != "" || u.User != nil:
			e.Add(f, "must be only scheme://host:port, got %q", d)
		}
	}
}
