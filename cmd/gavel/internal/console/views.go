package console

import (
	"context"
	"fmt"
	"maps"
	"regexp"
	"slices"
	"sort"
	"strings"
	"sync"
	"time"

	"golang.org/x/sync/errgroup"
	"google.golang.org/grpc"

	bbsv1 "github.com/gavel-sched/gavel/pkg/gen/gavel/bbs/v1"
	modelsv1 "github.com/gavel-sched/gavel/pkg/gen/gavel/models/v1"
	nsyncv1 "github.com/gavel-sched/gavel/pkg/gen/gavel/nsync/v1"
	repv1 "github.com/gavel-sched/gavel/pkg/gen/gavel/rep/v1"
	routeemitterv1 "github.com/gavel-sched/gavel/pkg/gen/gavel/routeemitter/v1"
)

// repStateTimeout bounds one rep's State call: an unreachable rep makes its cell say so
// instead of holding the page.
const repStateTimeout = 2 * time.Second

// bar is one used-of-total gauge.
type bar struct {
	Used, Total int64
	// Known is false when the use could not be read (the rep did not answer).
	Known bool
}

// Percent is the used share, 0 to 100.
func (b bar) Percent() int64 {
	if b.Total <= 0 || !b.Known {
		return 0
	}
	p := b.Used * 100 / b.Total
	return min(max(p, 0), 100)
}

// Low and High are the meter's thresholds: 70% and 90% of the total.
func (b bar) Low() int64 { return b.Total * 7 / 10 }

// High is 90% of the total.
func (b bar) High() int64 { return b.Total * 9 / 10 }

func (b *bar) add(o bar) {
	b.Total += o.Total
	if o.Known {
		b.Used += o.Used
		b.Known = true
	}
}

// cellView is one cell on the cells page.
type cellView struct {
	ID, Zone, RepAddress    string
	Tags, Rootfses          []string
	Memory, Disk, Container bar
	Instances               int
	Evacuating              bool
	StateError              string
	Notes                   []string
}

// zoneView sums a zone's cells.
type zoneView struct {
	Zone                    string
	Cells                   int
	Memory, Disk, Container bar
}

// cellsPage is the cells page's data.
type cellsPage struct {
	Zones []zoneView
	Cells []cellView
}

// repClients keeps one connection per rep address.
type repClients struct {
	dial  func(addr string) (*grpc.ClientConn, error)
	mu    sync.Mutex
	conns map[string]repv1.RepServiceClient
}

func (r *repClients) client(addr string) (repv1.RepServiceClient, error) {
	r.mu.Lock()
	defer r.mu.Unlock()
	if c, ok := r.conns[addr]; ok {
		return c, nil
	}
	conn, err := r.dial(addr)
	if err != nil {
		return nil, err
	}
	c := repv1.NewRepServiceClient(conn)
	r.conns[addr] = c
	return c, nil
}

func (s *Server) cellsPage(ctx context.Context) (*cellsPage, error) {
	resp, err := s.cfg.BBS.Cells(ctx, &bbsv1.CellsRequest{})
	if err != nil {
		return nil, fmt.Errorf("cells: %w", err)
	}
	actuals, err := s.cfg.BBS.ActualLRPs(ctx, &bbsv1.ActualLRPsRequest{})
	if err != nil {
		return nil, fmt.Errorf("actual LRPs: %w", err)
	}
	perCell := map[string]int{}
	for _, a := range actuals.GetActualLrps() {
		if c := a.GetInstanceKey().GetCellId(); c != "" {
			perCell[c]++
		}
	}
	cells := resp.GetCells()
	sort.Slice(cells, func(i, j int) bool { return cells[i].GetCellId() < cells[j].GetCellId() })
	views := make([]cellView, len(cells))
	g, gctx := errgroup.WithContext(ctx)
	g.SetLimit(8)
	for i, cp := range cells {
		v := &views[i]
		*v = cellView{ID: cp.GetCellId(), Zone: cp.GetZone(), RepAddress: cp.GetRepAddress(), Tags: sorted(cp.GetPlacementTags()),
			Instances: perCell[cp.GetCellId()],
			Memory:    bar{Total: int64(cp.GetCapacity().GetMemoryMb())}, Disk: bar{Total: int64(cp.GetCapacity().GetDiskMb())},
			Container: bar{Total: int64(cp.GetCapacity().GetContainers())}}
		for name := range cp.GetPreloadedRootfses() {
			v.Rootfses = append(v.Rootfses, "preloaded:"+name)
		}
		sort.Strings(v.Rootfses)
		for _, p := range cp.GetRootfsProviders() {
			v.Rootfses = append(v.Rootfses, p+":")
		}
		if s.reps == nil {
			v.StateError = "use unknown: the console has no way to reach reps"
			continue
		}
		g.Go(func() error {
			c, err := s.reps.client(cp.GetRepAddress())
			if err != nil {
				v.StateError = "use unknown: " + err.Error()
				return nil
			}
			sctx, cancel := context.WithTimeout(gctx, repStateTimeout)
			defer cancel()
			st, err := c.State(sctx, &repv1.StateRequest{})
			if err != nil {
				v.StateError = fmt.Sprintf("use unknown: rep at %s: %v", cp.GetRepAddress(), err)
				return nil
			}
			total, avail := st.GetTotalResources(), st.GetAvailableResources()
			v.Memory = bar{Used: int64(total.GetMemoryMb() - avail.GetMemoryMb()), Total: int64(total.GetMemoryMb()), Known: true}
			v.Disk = bar{Used: int64(total.GetDiskMb() - avail.GetDiskMb()), Total: int64(total.GetDiskMb()), Known: true}
			v.Container = bar{Used: int64(total.GetContainers() - avail.GetContainers()), Total: int64(total.GetContainers()), Known: true}
			v.Evacuating, v.Notes = st.GetEvacuating(), st.GetNotes()
			return nil
		})
	}
	_ = g.Wait()
	zones := map[string]*zoneView{}
	var page cellsPage
	for _, v := range views {
		z := zones[v.Zone]
		if z == nil {
			z = &zoneView{Zone: v.Zone}
			zones[v.Zone] = z
		}
		z.Cells++
		z.Memory.add(v.Memory)
		z.Disk.add(v.Disk)
		z.Container.add(v.Container)
	}
	for _, name := range sortedKeys(zones) {
		page.Zones = append(page.Zones, *zones[name])
	}
	page.Cells = views
	return &page, nil
}

// count is a label and a number.
type count struct {
	Name string
	N    int
}

// problem is one placement error and the instances that have it.
type problem struct {
	Code    string // the code in words
	RawCode string
	Message string
	Reasons []string // per-reason cell counts, from the message
	Indexes []int32
}

// instanceView is one actual LRP.
type instanceView struct {
	Index                    int32
	State, Presence          string
	Cell, Zone, Address      string
	CrashCount               int32
	CrashReason              string
	Since                    string
	Placement                string
	Routable, CanRetire      bool
	ProcessGuid, InstanceKey string
}

// lrpView is one desired LRP with its instances.
type lrpView struct {
	Guid, Domain, Rootfs string
	Desired              int32
	MemoryMB, DiskMB     int32
	States               []count
	Cells                []count
	Problems             []problem
	Routes               []string
	Provides, Consumes   []string
	Instances            []instanceView
	Evacuating           int
	Crashes              int32
	Labels               string
}

// lrpsPage is the LRPs page's data (one LRP on its own page).
type lrpsPage struct {
	LRPs        []lrpView
	RoutesError string
	History     []line
	Started     time.Time
}

func (s *Server) lrpsPage(ctx context.Context, guid string) (*lrpsPage, error) {
	filter := &bbsv1.Filter{}
	if guid != "" {
		filter.ProcessGuids = []string{guid}
	}
	desired, err := s.cfg.BBS.DesiredLRPs(ctx, &bbsv1.DesiredLRPsRequest{Filter: filter})
	if err != nil {
		return nil, fmt.Errorf("desired LRPs: %w", err)
	}
	actuals, err := s.cfg.BBS.ActualLRPs(ctx, &bbsv1.ActualLRPsRequest{Filter: filter})
	if err != nil {
		return nil, fmt.Errorf("actual LRPs: %w", err)
	}
	page := &lrpsPage{Started: s.hub.since}
	routes := map[string][]string{}
	if s.cfg.RouteEmitter != nil {
		rctx, cancel := context.WithTimeout(ctx, repStateTimeout)
		table, err := s.cfg.RouteEmitter.RoutingTable(rctx, &routeemitterv1.RoutingTableRequest{})
		cancel()
		if err != nil {
			page.RoutesError = "routes unknown: route-emitter: " + err.Error()
		}
		for _, r := range table.GetRoutes() {
			name := r.GetHostname()
			if r.GetProtocol() != routeemitterv1.Route_PROTOCOL_HTTP {
				name = fmt.Sprintf("%s :%d", strings.ToLower(strings.TrimPrefix(r.GetProtocol().String(), "PROTOCOL_")), r.GetIncomingPort())
			}
			seen := map[string]bool{}
			for _, e := range r.GetEndpoints() {
				if !seen[e.GetProcessGuid()] {
					seen[e.GetProcessGuid()] = true
					routes[e.GetProcessGuid()] = append(routes[e.GetProcessGuid()], name)
				}
			}
		}
	} else {
		page.RoutesError = "routes unknown: no route-emitter address"
	}
	byGuid := map[string][]*modelsv1.ActualLRP{}
	for _, a := range actuals.GetActualLrps() {
		g := a.GetKey().GetProcessGuid()
		byGuid[g] = append(byGuid[g], a)
	}
	lrps := desired.GetDesiredLrps()
	sort.Slice(lrps, func(i, j int) bool { return lrps[i].GetProcessGuid() < lrps[j].GetProcessGuid() })
	for _, d := range lrps {
		v := lrpView{Guid: d.GetProcessGuid(), Domain: d.GetDomain(), Rootfs: d.GetRootfs(), Desired: d.GetInstances(),
			MemoryMB: d.GetMemoryMb(), DiskMB: d.GetDiskMb(), Routes: sorted(routes[d.GetProcessGuid()]), Labels: labelString(d.GetLabels())}
		for _, p := range d.GetLinks().GetProvides() {
			v.Provides = append(v.Provides, fmt.Sprintf("%s (type %s, port %d)", p.GetName(), orDash(p.GetType()), p.GetPort()))
		}
		for _, c := range d.GetLinks().GetConsumes() {
			from := c.GetFrom()
			if from == "" {
				from = "type " + c.GetType()
			}
			v.Consumes = append(v.Consumes, fmt.Sprintf("%s from %s", c.GetName(), from))
		}
		states, cells := map[string]int{}, map[string]int{}
		problems := map[string]*problem{}
		var order []string
		for _, a := range byGuid[d.GetProcessGuid()] {
			st := stateWord(a.GetState())
			states[st]++
			if c := a.GetInstanceKey().GetCellId(); c != "" {
				cells[c]++
			}
			iv := instanceView{Index: a.GetKey().GetIndex(), State: st, Presence: presenceWord(a.GetPresence()), Cell: a.GetInstanceKey().GetCellId(),
				Zone: a.GetZone(), CrashCount: a.GetCrashCount(), CrashReason: a.GetCrashReason(), Routable: a.GetRoutable(), ProcessGuid: d.GetProcessGuid(),
				CanRetire: a.GetPresence() != modelsv1.ActualLRP_PRESENCE_EVACUATING}
			if ni := a.GetNetInfo(); ni.GetAddress() != "" {
				var ports []string
				for _, p := range ni.GetPorts() {
					ports = append(ports, fmt.Sprintf("%d→%d", p.GetHostPort(), p.GetContainerPort()))
				}
				iv.Address = ni.GetAddress() + " " + strings.Join(ports, " ")
			}
			if t := a.GetSince(); t != nil {
				iv.Since = t.AsTime().Local().Format("2006-01-02 15:04:05")
			}
			if a.GetPresence() == modelsv1.ActualLRP_PRESENCE_EVACUATING {
				v.Evacuating++
			}
			v.Crashes += a.GetCrashCount()
			if pe := a.GetPlacementError(); pe.GetCode() != modelsv1.PlacementError_CODE_UNSPECIFIED {
				key := pe.GetCode().String() + "\x00" + pe.GetMessage()
				p := problems[key]
				if p == nil {
					p = &problem{Code: codeWords(pe.GetCode()), RawCode: strings.TrimPrefix(pe.GetCode().String(), "CODE_"), Message: pe.GetMessage(), Reasons: reasons(pe.GetMessage())}
					problems[key] = p
					order = append(order, key)
				}
				p.Indexes = append(p.Indexes, a.GetKey().GetIndex())
				iv.Placement = codeWords(pe.GetCode())
			}
			v.Instances = append(v.Instances, iv)
		}
		for _, st := range []string{"running", "claimed", "unclaimed", "crashed"} {
			if states[st] > 0 {
				v.States = append(v.States, count{st, states[st]})
			}
		}
		for _, c := range sortedKeys(cells) {
			v.Cells = append(v.Cells, count{c, cells[c]})
		}
		for _, k := range order {
			v.Problems = append(v.Problems, *problems[k])
		}
		page.LRPs = append(page.LRPs, v)
	}
	if guid != "" {
		page.History = s.hub.historyOf(guid)
	}
	return page, nil
}

// codeWords says a placement error code in words.
func codeWords(c modelsv1.PlacementError_Code) string {
	switch c {
	case modelsv1.PlacementError_CODE_CELL_MISMATCH:
		return "No cell can run it (cell mismatch)"
	case modelsv1.PlacementError_CODE_INSUFFICIENT_RESOURCES:
		return "No compatible cell has room (insufficient resources)"
	case modelsv1.PlacementError_CODE_CELL_COMMUNICATION:
		return "Compatible cells could not be reached (cell communication)"
	case modelsv1.PlacementError_CODE_IN_FLIGHT_LIMIT:
		return "Waiting: too many placements in flight (in-flight limit)"
	}
	return c.String()
}

// reasonsRE finds the parenthesised per-reason counts at the end of a placement message:
// `found no compatible cell: 0/9 cells eligible (5 lack tag "staging", 4 lack rootfs "x")`.
var reasonsRE = regexp.MustCompile(`\(([^()]*)\)\s*$`)

// reasons splits a placement message's per-reason cell counts into one item each (commas
// inside quotes stay).
func reasons(msg string) []string {
	m := reasonsRE.FindStringSubmatch(msg)
	if m == nil {
		return nil
	}
	body := m[1]
	if head, tail, ok := strings.Cut(body, ": "); ok && strings.Contains(head, "compatible") {
		body = tail // "4 compatible cells: 2 without room, 1 is evacuating"
	}
	var out []string
	var cur strings.Builder
	quoted := false
	for _, r := range body {
		switch {
		case r == '"':
			quoted = !quoted
			cur.WriteRune(r)
		case r == ',' && !quoted:
			out = append(out, strings.TrimSpace(cur.String()))
			cur.Reset()
		default:
			cur.WriteRune(r)
		}
	}
	if s := strings.TrimSpace(cur.String()); s != "" {
		out = append(out, s)
	}
	return out
}

// taskView is one task.
type taskView struct {
	Guid, Domain, State, Cell string
	Failed                    bool
	FailureReason, Result     string
	Placement, Message        string
	Rejections                int32
	Created                   string
	CanCancel                 bool
}

func (s *Server) tasksPage(ctx context.Context) ([]taskView, error) {
	resp, err := s.cfg.BBS.Tasks(ctx, &bbsv1.TasksRequest{})
	if err != nil {
		return nil, fmt.Errorf("tasks: %w", err)
	}
	var out []taskView
	for _, t := range resp.GetTasks() {
		v := taskView{Guid: t.GetTaskGuid(), Domain: t.GetDomain(), State: taskStateWord(t.GetState()), Cell: t.GetCellId(), Failed: t.GetFailed(),
			FailureReason: t.GetFailureReason(), Result: t.GetResult(), Rejections: t.GetRejectionCount(),
			CanCancel: t.GetState() == modelsv1.Task_STATE_PENDING || t.GetState() == modelsv1.Task_STATE_RUNNING}
		if pe := t.GetPlacementError(); pe.GetCode() != modelsv1.PlacementError_CODE_UNSPECIFIED {
			v.Placement, v.Message = codeWords(pe.GetCode()), pe.GetMessage()
		}
		if c := t.GetCreatedAt(); c != nil {
			v.Created = c.AsTime().Local().Format("2006-01-02 15:04:05")
		}
		out = append(out, v)
	}
	return out, nil
}

// poolsPage is nsync's placement pools.
type poolsPage struct {
	Pools   []*nsyncv1.PlacementPoolInfo
	Default string
}

func (s *Server) poolsPage(ctx context.Context) (*poolsPage, error) {
	if s.cfg.Nsync == nil {
		return nil, fmt.Errorf("no nsync address: start the console with --nsync ADDR")
	}
	resp, err := s.cfg.Nsync.PlacementPools(ctx, &nsyncv1.PlacementPoolsRequest{})
	if err != nil {
		return nil, fmt.Errorf("nsync placement pools: %w", err)
	}
	return &poolsPage{Pools: resp.GetPools(), Default: resp.GetDefaultPool()}, nil
}

func stateWord(s modelsv1.ActualLRP_State) string {
	return strings.ToLower(strings.TrimPrefix(s.String(), "STATE_"))
}

func presenceWord(p modelsv1.ActualLRP_Presence) string {
	return strings.ToLower(strings.TrimPrefix(p.String(), "PRESENCE_"))
}

func taskStateWord(s modelsv1.Task_State) string {
	return strings.ToLower(strings.TrimPrefix(s.String(), "STATE_"))
}

func labelString(m map[string]string) string {
	var parts []string
	for _, k := range sortedKeys(m) {
		parts = append(parts, k+"="+m[k])
	}
	return strings.Join(parts, ",")
}

func orDash(s string) string {
	if s == "" {
		return "-"
	}
	return s
}

func sorted(s []string) []string {
	out := append([]string(nil), s...)
	sort.Strings(out)
	return out
}

func sortedKeys[V any](m map[string]V) []string { return slices.Sorted(maps.Keys(m)) }
