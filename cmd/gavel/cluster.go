package main

import (
	"fmt"
	"sort"
	"strconv"
	"strings"
	"time"

	"github.com/spf13/cobra"
	"google.golang.org/grpc"

	bbsv1 "github.com/gavel-sched/gavel/pkg/gen/gavel/bbs/v1"
	modelsv1 "github.com/gavel-sched/gavel/pkg/gen/gavel/models/v1"
	repv1 "github.com/gavel-sched/gavel/pkg/gen/gavel/rep/v1"
	routeemitterv1 "github.com/gavel-sched/gavel/pkg/gen/gavel/routeemitter/v1"
)

func (c *cli) clusterCommands() []*cobra.Command {
	var wCells watchFlags
	cells := &cobra.Command{
		Use:   "cells",
		Short: "List the cells present: zone, capacity, tags, root filesystems",
		Args:  cobra.NoArgs,
		RunE: func(cmd *cobra.Command, _ []string) error {
			return c.listBBS(cmd, wCells, func(p *printer, bbs bbsv1.BBSServiceClient) error {
				resp, err := bbs.Cells(cmd.Context(), &bbsv1.CellsRequest{})
				if err != nil {
					return err
				}
				sort.Slice(resp.Cells, func(i, j int) bool { return resp.Cells[i].GetCellId() < resp.Cells[j].GetCellId() })
				if p.structured() {
					return p.doc(resp)
				}
				return printCells(p, resp.GetCells())
			})
		},
	}
	wCells.bind(cells)

	cellState := &cobra.Command{
		Use:               "cell-state CELL",
		Short:             "Ask a cell's rep for its state: capacity, used, containers, rootfses, tags",
		Args:              cobra.ExactArgs(1),
		ValidArgsFunction: c.completeFrom(cellIDs),
		RunE: func(cmd *cobra.Command, args []string) error {
			p, bbs, err := c.clients()
			if err != nil {
				return err
			}
			resp, err := bbs.Cells(cmd.Context(), &bbsv1.CellsRequest{})
			if err != nil {
				return err
			}
			var presence *modelsv1.CellPresence
			for _, cp := range resp.GetCells() {
				if cp.GetCellId() == args[0] {
					presence = cp
				}
			}
			if presence == nil {
				return withExit(exitNotFound, fmt.Errorf("cell %q is not present (gavel cells lists the cells)", args[0]))
			}
			conn, err := c.dial(presence.GetRepAddress())
			if err != nil {
				return err
			}
			st, err := repv1.NewRepServiceClient(conn).State(cmd.Context(), &repv1.StateRequest{}, grpc.WaitForReady(false))
			if err != nil {
				return fmt.Errorf("cell %s at %s: %w", args[0], presence.GetRepAddress(), err)
			}
			sort.Slice(st.Lrps, func(i, j int) bool {
				a, b := st.Lrps[i].GetKey(), st.Lrps[j].GetKey()
				if a.GetProcessGuid() != b.GetProcessGuid() {
					return a.GetProcessGuid() < b.GetProcessGuid()
				}
				return a.GetIndex() < b.GetIndex()
			})
			sort.Slice(st.Tasks, func(i, j int) bool { return st.Tasks[i].GetTaskGuid() < st.Tasks[j].GetTaskGuid() })
			if p.structured() {
				return p.doc(st)
			}
			return printCellState(p, st)
		},
	}

	tags := &cobra.Command{
		Use:   "tags",
		Short: "List the placement tags of the present cells",
		Args:  cobra.NoArgs,
		RunE: func(cmd *cobra.Command, _ []string) error {
			p, bbs, err := c.clients()
			if err != nil {
				return err
			}
			resp, err := bbs.Tags(cmd.Context(), &bbsv1.TagsRequest{})
			if err != nil {
				return err
			}
			sort.Strings(resp.Tags)
			if p.structured() {
				return p.doc(resp)
			}
			t := p.table("TAG")
			for _, tag := range resp.GetTags() {
				t.row(tag)
			}
			return t.flush()
		},
	}

	domains := &cobra.Command{
		Use:   "domains",
		Short: "List the fresh domains",
		Args:  cobra.NoArgs,
		RunE: func(cmd *cobra.Command, _ []string) error {
			p, bbs, err := c.clients()
			if err != nil {
				return err
			}
			resp, err := bbs.Domains(cmd.Context(), &bbsv1.DomainsRequest{})
			if err != nil {
				return err
			}
			sort.Slice(resp.Domains, func(i, j int) bool { return resp.Domains[i].GetName() < resp.Domains[j].GetName() })
			if p.structured() {
				return p.doc(resp)
			}
			t := p.table("DOMAIN", "TTL")
			for _, d := range resp.GetDomains() {
				ttl := "forever"
				if d.GetTtlSeconds() > 0 {
					ttl = (time.Duration(d.GetTtlSeconds()) * time.Second).String()
				}
				t.row(d.GetName(), ttl)
			}
			return t.flush()
		},
	}

	var ttl time.Duration
	setDomain := &cobra.Command{
		Use:   "set-domain DOMAIN",
		Short: "Mark a domain fresh (convergence then removes extra instances in it)",
		Args:  cobra.ExactArgs(1),
		RunE: func(cmd *cobra.Command, args []string) error {
			bbs, err := c.bbsClient()
			if err != nil {
				return err
			}
			if _, err := bbs.UpsertDomain(cmd.Context(), &bbsv1.UpsertDomainRequest{Domain: args[0], TtlSeconds: int64(ttl / time.Second)}); err != nil {
				return fmt.Errorf("set domain %s: %w", args[0], err)
			}
			fmt.Fprintf(c.err, "domain %s is fresh for %s\n", args[0], map[bool]string{true: "ever", false: ttl.String()}[ttl == 0])
			return nil
		},
	}
	setDomain.Flags().DurationVar(&ttl, "ttl", 0, "how long the domain stays fresh (0: forever)")

	var since int64
	var evFilter bbsv1.Filter
	events := &cobra.Command{
		Use:   "events [GUID...]",
		Short: "Follow the event stream (one line per event; -o json: one JSON document per revision)",
		RunE: func(cmd *cobra.Command, args []string) error {
			p, bbs, err := c.clients()
			if err != nil {
				return err
			}
			evFilter.ProcessGuids = args
			stream, err := bbs.SubscribeToEvents(cmd.Context(), &bbsv1.SubscribeToEventsRequest{SinceRevision: since, Filter: &evFilter}, grpc.WaitForReady(true))
			if err != nil {
				return err
			}
			for {
				msg, err := stream.Recv()
				if err != nil {
					if cmd.Context().Err() != nil {
						return nil
					}
					return err
				}
				if p.format == formatJSON {
					b, err := docJSON(msg, "events.*.desiredLrpCreated.desiredLrp.routes", "events.*.desiredLrpChanged.before.routes",
						"events.*.desiredLrpChanged.after.routes", "events.*.desiredLrpRemoved.desiredLrp.routes")
					if err != nil {
						return err
					}
					fmt.Fprintf(c.out, "%s\n", b)
					continue
				}
				for _, e := range msg.GetEvents() {
					fmt.Fprintln(c.out, eventLine(msg.GetRevision(), e))
				}
			}
		},
	}
	events.Flags().Int64Var(&since, "since", 0, "resume after this revision")
	events.Flags().StringVar(&evFilter.Domain, "domain", "", "only this domain")
	events.Flags().StringVar(&evFilter.CellId, "cell", "", "only this cell")
	events.Flags().StringVarP(&evFilter.LabelSelector, "selector", "l", "", "only records whose labels match, e.g. app=web,tier!=db,env in (a,b)")

	var wRoutes watchFlags
	routes := &cobra.Command{
		Use:   "routes",
		Short: "Show the route-emitter's routing table (--route-emitter ADDR)",
		Args:  cobra.NoArgs,
		RunE: func(cmd *cobra.Command, _ []string) error {
			conn, err := c.dial(c.routeEmitter)
			if err != nil {
				return err
			}
			re := routeemitterv1.NewRouteEmitterServiceClient(conn)
			return c.list(cmd, wRoutes, func(p *printer) error {
				resp, err := re.RoutingTable(cmd.Context(), &routeemitterv1.RoutingTableRequest{})
				if err != nil {
					return err
				}
				sortRoutes(resp.Routes)
				if p.structured() {
					return p.doc(resp)
				}
				return printRoutes(p, resp.GetRoutes())
			})
		},
	}
	wRoutes.bind(routes)
	return []*cobra.Command{cells, cellState, tags, domains, setDomain, events, c.logsCommand(), routes}
}

// printCells renders the cells sorted by id.
func printCells(p *printer, cells []*modelsv1.CellPresence) error {
	sorted := append([]*modelsv1.CellPresence(nil), cells...)
	sort.Slice(sorted, func(i, j int) bool { return sorted[i].GetCellId() < sorted[j].GetCellId() })
	headers := []string{"CELL", "ZONE", "MEMORY", "DISK", "CONTAINERS", "TAGS", "ROOTFS"}
	if p.wide() {
		headers = append(headers, "REP_ADDRESS", "ADDRESS")
	}
	t := p.table(headers...)
	for _, cp := range sorted {
		r := []any{cp.GetCellId(), cp.GetZone(), fmt.Sprintf("%dM", cp.GetCapacity().GetMemoryMb()),
			fmt.Sprintf("%dM", cp.GetCapacity().GetDiskMb()), cp.GetCapacity().GetContainers(), join(cp.GetPlacementTags()), rootfsList(cp)}
		if p.wide() {
			r = append(r, cp.GetRepAddress(), cp.GetAddress())
		}
		t.row(r...)
	}
	return t.flush()
}

// rootfsList names a cell's preloaded rootfses and providers.
func rootfsList(cp *modelsv1.CellPresence) string {
	var parts []string
	for _, name := range sortedKeys(cp.GetPreloadedRootfses()) {
		parts = append(parts, "preloaded:"+name)
	}
	for _, prov := range cp.GetRootfsProviders() {
		parts = append(parts, prov+":")
	}
	return join(parts)
}

// printCellState renders a rep's State.
func printCellState(p *printer, st *repv1.StateResponse) error {
	total, avail := st.GetTotalResources(), st.GetAvailableResources()
	t := p.table("FIELD", "VALUE")
	t.row("cell", st.GetCellId())
	t.row("zone", st.GetZone())
	t.row("memory", fmt.Sprintf("%dM used of %dM", total.GetMemoryMb()-avail.GetMemoryMb(), total.GetMemoryMb()))
	t.row("disk", fmt.Sprintf("%dM used of %dM", total.GetDiskMb()-avail.GetDiskMb(), total.GetDiskMb()))
	t.row("containers", fmt.Sprintf("%d used of %d (%d starting)", total.GetContainers()-avail.GetContainers(), total.GetContainers(), st.GetStartingContainerCount()))
	t.row("tags", join(st.GetPlacementTags()))
	t.row("preloaded", join(sortedStrings(st.GetPreloadedRootfses())))
	t.row("providers", join(st.GetRootfsProviders()))
	t.row("evacuating", strconv.FormatBool(st.GetEvacuating()))
	if st.GetIsolation() != "" {
		t.row("isolation", st.GetIsolation())
		t.row("enforced", join(st.GetEnforced()))
	}
	for _, n := range st.GetNotes() {
		t.row("note", n)
	}
	if err := t.flush(); err != nil {
		return err
	}
	fmt.Fprintln(p.out)
	lrps := append([]*repv1.LRPInstance(nil), st.GetLrps()...)
	sort.Slice(lrps, func(i, j int) bool {
		a, b := lrps[i].GetKey(), lrps[j].GetKey()
		if a.GetProcessGuid() != b.GetProcessGuid() {
			return a.GetProcessGuid() < b.GetProcessGuid()
		}
		return a.GetIndex() < b.GetIndex()
	})
	ct := p.table("KIND", "GUID", "INDEX", "MEMORY", "DISK", "ROOTFS")
	for _, l := range lrps {
		ct.row("lrp", l.GetKey().GetProcessGuid(), l.GetKey().GetIndex(), fmt.Sprintf("%dM", l.GetResources().GetMemoryMb()),
			fmt.Sprintf("%dM", l.GetResources().GetDiskMb()), l.GetRootfs())
	}
	tasks := append([]*repv1.TaskWork(nil), st.GetTasks()...)
	sort.Slice(tasks, func(i, j int) bool { return tasks[i].GetTaskGuid() < tasks[j].GetTaskGuid() })
	for _, k := range tasks {
		ct.row("task", k.GetTaskGuid(), "", fmt.Sprintf("%dM", k.GetResources().GetMemoryMb()),
			fmt.Sprintf("%dM", k.GetResources().GetDiskMb()), k.GetRootfs())
	}
	return ct.flush()
}

// printRoutes renders the routing table sorted by protocol, hostname and port.
func printRoutes(p *printer, routes []*routeemitterv1.Route) error {
	sorted := append([]*routeemitterv1.Route(nil), routes...)
	sortRoutes(sorted)
	headers := []string{"PROTOCOL", "ROUTE", "TLS_ONLY", "ENDPOINTS"}
	if p.wide() {
		headers = append(headers, "INSTANCES")
	}
	t := p.table(headers...)
	for _, r := range sorted {
		name := r.GetHostname()
		if r.GetProtocol() != routeemitterv1.Route_PROTOCOL_HTTP {
			name = ":" + strconv.Itoa(int(r.GetIncomingPort()))
		}
		var eps, inst []string
		for _, e := range r.GetEndpoints() {
			eps = append(eps, fmt.Sprintf("%s:%d", e.GetAddress(), e.GetPort()))
			inst = append(inst, fmt.Sprintf("%s/%d", e.GetProcessGuid(), e.GetIndex()))
		}
		sort.Strings(eps)
		sort.Strings(inst)
		row := []any{strings.ToLower(trimEnum(r.GetProtocol().String(), "PROTOCOL_")), name, strconv.FormatBool(r.GetTlsOnly()), join(eps)}
		if p.wide() {
			row = append(row, join(inst))
		}
		t.row(row...)
	}
	return t.flush()
}

// sortRoutes orders routes by protocol, hostname and incoming port, and each route's
// endpoints by process guid and index (stable output).
func sortRoutes(routes []*routeemitterv1.Route) {
	sort.Slice(routes, func(i, j int) bool {
		a, b := routes[i], routes[j]
		if a.GetProtocol() != b.GetProtocol() {
			return a.GetProtocol() < b.GetProtocol()
		}
		if a.GetHostname() != b.GetHostname() {
			return a.GetHostname() < b.GetHostname()
		}
		return a.GetIncomingPort() < b.GetIncomingPort()
	})
	for _, r := range routes {
		eps := r.Endpoints
		sort.Slice(eps, func(i, j int) bool {
			if eps[i].GetProcessGuid() != eps[j].GetProcessGuid() {
				return eps[i].GetProcessGuid() < eps[j].GetProcessGuid()
			}
			return eps[i].GetIndex() < eps[j].GetIndex()
		})
	}
}

// eventLine renders one event as "REVISION TYPE subject details".
func eventLine(rev int64, e *bbsv1.Event) string {
	actual := func(a *modelsv1.ActualLRP) string {
		return fmt.Sprintf("%s/%d %s %s", a.GetKey().GetProcessGuid(), a.GetKey().GetIndex(),
			trimEnum(a.GetState().String(), "STATE_"), a.GetInstanceKey().GetCellId())
	}
	var kind, what string
	switch k := e.GetKind().(type) {
	case *bbsv1.Event_DesiredLrpCreated:
		kind, what = "desired_lrp_created", k.DesiredLrpCreated.GetDesiredLrp().GetProcessGuid()
	case *bbsv1.Event_DesiredLrpChanged:
		kind, what = "desired_lrp_changed", fmt.Sprintf("%s instances %d", k.DesiredLrpChanged.GetAfter().GetProcessGuid(), k.DesiredLrpChanged.GetAfter().GetInstances())
	case *bbsv1.Event_DesiredLrpRemoved:
		kind, what = "desired_lrp_removed", k.DesiredLrpRemoved.GetDesiredLrp().GetProcessGuid()
	case *bbsv1.Event_ActualLrpCreated:
		kind, what = "actual_lrp_created", actual(k.ActualLrpCreated.GetActualLrp())
	case *bbsv1.Event_ActualLrpChanged:
		kind, what = "actual_lrp_changed", actual(k.ActualLrpChanged.GetAfter())
	case *bbsv1.Event_ActualLrpRemoved:
		kind, what = "actual_lrp_removed", actual(k.ActualLrpRemoved.GetActualLrp())
	case *bbsv1.Event_ActualLrpCrashed:
		kind, what = "actual_lrp_crashed", fmt.Sprintf("%s/%d crashes %d: %s", k.ActualLrpCrashed.GetKey().GetProcessGuid(),
			k.ActualLrpCrashed.GetKey().GetIndex(), k.ActualLrpCrashed.GetCrashCount(), k.ActualLrpCrashed.GetCrashReason())
	case *bbsv1.Event_TaskCreated:
		kind, what = "task_created", k.TaskCreated.GetTask().GetTaskGuid()
	case *bbsv1.Event_TaskChanged:
		kind, what = "task_changed", k.TaskChanged.GetAfter().GetTaskGuid()+" "+trimEnum(k.TaskChanged.GetAfter().GetState().String(), "STATE_")
	case *bbsv1.Event_TaskRemoved:
		kind, what = "task_removed", k.TaskRemoved.GetTask().GetTaskGuid()
	case *bbsv1.Event_CellAppeared:
		kind, what = "cell_appeared", k.CellAppeared.GetCell().GetCellId()
	case *bbsv1.Event_LinksChanged:
		kind, what = "links_changed", k.LinksChanged.GetProcessGuid()
		if errs := k.LinksChanged.GetErrors(); len(errs) > 0 {
			what += ": " + strings.Join(errs, "; ")
		}
	case *bbsv1.Event_CellDisappeared:
		kind, what = "cell_disappeared", k.CellDisappeared.GetCell().GetCellId()
	default:
		kind = fmt.Sprintf("%T", e.GetKind())
	}
	return fmt.Sprintf("%d\t%s\t%s", rev, kind, what)
}

// sortedStrings returns a sorted copy.
func sortedStrings(s []string) []string {
	out := append([]string(nil), s...)
	sort.Strings(out)
	return out
}
