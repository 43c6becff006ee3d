package main

import (
	"fmt"
	"slices"
	"sort"
	"strconv"
	"strings"
	"time"

	"github.com/spf13/cobra"
	"go.yaml.in/yaml/v3"

	bbsv1 "github.com/gavel-sched/gavel/pkg/gen/gavel/bbs/v1"
	modelsv1 "github.com/gavel-sched/gavel/pkg/gen/gavel/models/v1"
	repv1 "github.com/gavel-sched/gavel/pkg/gen/gavel/rep/v1"
)

// Paths of routes maps in the documents the LRP commands print (see docJSON).
var (
	lrpRoutes  = []string{"routes"}
	lrpsRoutes = []string{"desiredLrps.*.routes"}
)

// filterFlags binds the list filters.
func filterFlags(cmd *cobra.Command, f *bbsv1.Filter, cell bool) {
	cmd.Flags().StringVar(&f.Domain, "domain", "", "only this domain")
	cmd.Flags().StringVarP(&f.LabelSelector, "selector", "l", "", "label selector, e.g. app=web,tier!=db,env in (a,b)")
	if cell {
		cmd.Flags().StringVar(&f.CellId, "cell", "", "only this cell")
	}
}

// waitFlags binds --wait and --timeout.
type waitFlags struct {
	wait    bool
	timeout time.Duration
}

func (w *waitFlags) bind(cmd *cobra.Command) {
	cmd.Flags().BoolVar(&w.wait, "wait", false, "wait until every instance is RUNNING, printing progress and placement errors")
	cmd.Flags().DurationVar(&w.timeout, "timeout", 2*time.Minute, "how long --wait waits")
}

func (c *cli) lrpCommands() []*cobra.Command {
	var listFilter, actualFilter bbsv1.Filter
	var watchLRPs, watchActuals watchFlags
	lrps := &cobra.Command{
		Use:   "lrps",
		Short: "List desired LRPs",
		Args:  cobra.NoArgs,
		RunE: func(cmd *cobra.Command, _ []string) error {
			return c.listBBS(cmd, watchLRPs, func(p *printer, bbs bbsv1.BBSServiceClient) error {
				resp, err := bbs.DesiredLRPs(cmd.Context(), &bbsv1.DesiredLRPsRequest{Filter: &listFilter})
				if err != nil {
					return err
				}
				return printDesiredLRPs(p, resp)
			})
		},
	}
	filterFlags(lrps, &listFilter, false)
	watchLRPs.bind(lrps)

	lrp := &cobra.Command{
		Use:               "lrp GUID",
		Short:             "Show a desired LRP and its instances",
		Args:              cobra.ExactArgs(1),
		ValidArgsFunction: c.completeFrom(processGuids),
		RunE: func(cmd *cobra.Command, args []string) error {
			p, bbs, err := c.clients()
			if err != nil {
				return err
			}
			resp, err := bbs.DesiredLRPByProcessGuid(cmd.Context(), &bbsv1.DesiredLRPByProcessGuidRequest{ProcessGuid: args[0]})
			if err != nil {
				return err
			}
			if p.structured() {
				return p.doc(resp.GetDesiredLrp(), lrpRoutes...)
			}
			actuals, err := bbs.ActualLRPs(cmd.Context(), &bbsv1.ActualLRPsRequest{Filter: &bbsv1.Filter{ProcessGuids: []string{args[0]}}})
			if err != nil {
				return err
			}
			return printDesiredLRP(p, resp.GetDesiredLrp(), actuals.GetActualLrps(), instanceMetrics(cmd.Context(), bbs, args[0]))
		},
	}

	actual := &cobra.Command{
		Use:     "actual-lrps [GUID...]",
		Aliases: []string{"instances"},
		Short:   "List actual LRPs (instances): state, cell, address, placement errors",
		RunE: func(cmd *cobra.Command, args []string) error {
			f := &bbsv1.Filter{Domain: actualFilter.Domain, CellId: actualFilter.CellId, LabelSelector: actualFilter.LabelSelector, ProcessGuids: args}
			return c.listBBS(cmd, watchActuals, func(p *printer, bbs bbsv1.BBSServiceClient) error {
				resp, err := bbs.ActualLRPs(cmd.Context(), &bbsv1.ActualLRPsRequest{Filter: f})
				if err != nil {
					return err
				}
				sortActualLRPs(resp.ActualLrps)
				if p.structured() {
					return p.doc(resp)
				}
				return printActualLRPs(p, resp.GetActualLrps())
			})
		},
		ValidArgsFunction: c.completeFrom(processGuids),
	}
	filterFlags(actual, &actualFilter, true)
	watchActuals.bind(actual)

	var desireWait waitFlags
	desire := &cobra.Command{
		Use:   "desire-lrp FILE",
		Short: "Desire an LRP from a YAML or JSON file (\"-\" reads stdin); routes are native JSON",
		Args:  cobra.ExactArgs(1),
		RunE: func(cmd *cobra.Command, args []string) error {
			var d modelsv1.DesiredLRP
			routes, err := readDocument(args[0], &d, "routes")
			if err != nil {
				return withExit(exitUsage, err)
			}
			if routes != nil {
				d.Routes = routes
			}
			bbs, err := c.bbsClient()
			if err != nil {
				return err
			}
			resp, err := bbs.DesireLRP(cmd.Context(), &bbsv1.DesireLRPRequest{DesiredLrp: &d})
			if err != nil {
				return fmt.Errorf("desire LRP %q: %w", d.GetProcessGuid(), err)
			}
			fmt.Fprintf(c.err, "desired LRP %s (%d instances) at revision %d\n", d.GetProcessGuid(), d.GetInstances(), resp.GetRevision())
			if desireWait.wait {
				return c.waitLRP(cmd.Context(), d.GetProcessGuid(), desireWait.timeout)
			}
			return nil
		},
	}
	desireWait.bind(desire)

	var (
		updWait    waitFlags
		instances  int32
		annotation string
		labels     []string
		routesFile string
		drains     []string
	)
	update := &cobra.Command{
		Use:   "update-lrp GUID",
		Short: "Change an LRP's instances, routes, labels, annotation or log drains",
		Example: `  gavel update-lrp web --instances 5 --wait
  gavel update-lrp web --routes routes.yaml      # a mapping: provider → routes document
  gavel update-lrp web --label app=web --label tier=front --annotation 'v2'
  gavel update-lrp web --log-drain syslog-tls://logs.example.com:6514   # --log-drain '' removes them`,
		Args:              cobra.ExactArgs(1),
		ValidArgsFunction: c.completeFrom(processGuids),
		RunE: func(cmd *cobra.Command, args []string) error {
			var u modelsv1.DesiredLRPUpdate
			if cmd.Flags().Changed("instances") {
				u.Instances = &instances
			}
			if cmd.Flags().Changed("annotation") {
				u.Annotation = &annotation
			}
			if cmd.Flags().Changed("label") {
				m, err := parseLabels(labels)
				if err != nil {
					return err
				}
				u.Labels = &modelsv1.LabelsUpdate{Labels: m}
			}
			if routesFile != "" {
				routes, err := readRoutesFile(routesFile)
				if err != nil {
					return withExit(exitUsage, err)
				}
				u.Routes = &modelsv1.RoutesUpdate{Routes: routes}
			}
			if cmd.Flags().Changed("log-drain") {
				u.LogDrains = &modelsv1.LogDrainsUpdate{LogDrains: slices.DeleteFunc(slices.Clone(drains), func(s string) bool { return s == "" })}
			}
			if u.Instances == nil && u.Annotation == nil && u.Labels == nil && u.Routes == nil && u.LogDrains == nil {
				return usageErrorf("nothing to update: pass --instances, --routes, --label, --annotation or --log-drain")
			}
			return c.updateLRP(cmd, args[0], &u, updWait)
		},
	}
	update.Flags().Int32Var(&instances, "instances", 0, "new instance count")
	update.Flags().StringVar(&annotation, "annotation", "", "new annotation")
	update.Flags().StringArrayVar(&labels, "label", nil, "label KEY=VALUE (repeatable; replaces every label; --label '' clears them)")
	update.Flags().StringVar(&routesFile, "routes", "", "YAML or JSON file mapping each routing provider to its routes document (replaces every route)")
	update.Flags().StringArrayVar(&drains, "log-drain", nil, "syslog drain syslog://HOST:PORT or syslog-tls://HOST:PORT (repeatable; replaces every drain, and the running instances switch; --log-drain '' removes them)")
	updWait.bind(update)

	var scaleWait waitFlags
	scale := &cobra.Command{
		Use:               "scale GUID N",
		Short:             "Set an LRP's instance count",
		Args:              cobra.ExactArgs(2),
		ValidArgsFunction: c.completeFrom(processGuids),
		RunE: func(cmd *cobra.Command, args []string) error {
			n, err := strconv.ParseInt(args[1], 10, 32)
			if err != nil || n < 0 {
				return usageErrorf("instance count %q: want a number ≥ 0", args[1])
			}
			n32 := int32(n)
			return c.updateLRP(cmd, args[0], &modelsv1.DesiredLRPUpdate{Instances: &n32}, scaleWait)
		},
	}
	scaleWait.bind(scale)

	var force bool
	remove := &cobra.Command{
		Use:               "remove-lrp GUID",
		Short:             "Remove a desired LRP (its instances are stopped)",
		Args:              cobra.ExactArgs(1),
		ValidArgsFunction: c.completeFrom(processGuids),
		RunE: func(cmd *cobra.Command, args []string) error {
			bbs, err := c.bbsClient()
			if err != nil {
				return err
			}
			resp, err := bbs.RemoveDesiredLRP(cmd.Context(), &bbsv1.RemoveDesiredLRPRequest{ProcessGuid: args[0], Force: force})
			if err != nil {
				return fmt.Errorf("remove %s: %w", args[0], err)
			}
			fmt.Fprintf(c.err, "removed LRP %s at revision %d\n", args[0], resp.GetRevision())
			return nil
		},
	}

	remove.Flags().BoolVar(&force, "force", false, "remove it even if other LRPs consume links it provides")

	retire := &cobra.Command{
		Use:               "retire-actual-lrp GUID INDEX",
		Short:             "Stop one instance (convergence starts a fresh one if it is still desired)",
		Args:              cobra.ExactArgs(2),
		ValidArgsFunction: c.completeFrom(processGuids),
		RunE: func(cmd *cobra.Command, args []string) error {
			idx, err := strconv.ParseInt(args[1], 10, 32)
			if err != nil || idx < 0 {
				return usageErrorf("index %q: want a number ≥ 0", args[1])
			}
			bbs, err := c.bbsClient()
			if err != nil {
				return err
			}
			if _, err := bbs.RetireActualLRP(cmd.Context(), &bbsv1.RetireActualLRPRequest{ProcessGuid: args[0], Index: int32(idx)}); err != nil {
				return fmt.Errorf("retire %s/%d: %w", args[0], idx, err)
			}
			fmt.Fprintf(c.err, "retired %s index %d\n", args[0], idx)
			return nil
		},
	}
	return []*cobra.Command{lrps, lrp, actual, desire, update, scale, remove, retire}
}

// updateLRP sends u and optionally waits for the instances.
func (c *cli) updateLRP(cmd *cobra.Command, guid string, u *modelsv1.DesiredLRPUpdate, w waitFlags) error {
	bbs, err := c.bbsClient()
	if err != nil {
		return err
	}
	resp, err := bbs.UpdateDesiredLRP(cmd.Context(), &bbsv1.UpdateDesiredLRPRequest{ProcessGuid: guid, Update: u})
	if err != nil {
		return fmt.Errorf("update %s: %w", guid, err)
	}
	fmt.Fprintf(c.err, "updated LRP %s (%d instances) at revision %d\n", guid, resp.GetDesiredLrp().GetInstances(), resp.GetRevision())
	if w.wait {
		return c.waitLRP(cmd.Context(), guid, w.timeout)
	}
	return nil
}

// readRoutesFile reads a mapping of provider → routes document, with the byte-exact rules of
// readDocument.
func readRoutesFile(path string) (map[string][]byte, error) {
	src, err := readInput(path)
	if err != nil {
		return nil, err
	}
	var doc yaml.Node
	if err := yaml.Unmarshal(src, &doc); err != nil {
		return nil, fmt.Errorf("%s: %w", path, err)
	}
	if len(doc.Content) != 1 {
		return map[string][]byte{}, nil
	}
	routes, err := routesFromNode(src, doc.Content[0])
	if err != nil {
		return nil, fmt.Errorf("%s: %w", path, err)
	}
	if routes == nil {
		routes = map[string][]byte{}
	}
	return routes, nil
}

// parseLabels parses KEY=VALUE pairs; a single empty value clears every label.
func parseLabels(pairs []string) (map[string]string, error) {
	m := map[string]string{}
	for _, p := range pairs {
		if p == "" {
			continue
		}
		k, v, ok := strings.Cut(p, "=")
		if !ok || k == "" {
			return nil, usageErrorf("label %q: want KEY=VALUE", p)
		}
		m[k] = v
	}
	return m, nil
}

// printDesiredLRPs renders the lrps list.
func printDesiredLRPs(p *printer, resp *bbsv1.DesiredLRPsResponse) error {
	sort.Slice(resp.DesiredLrps, func(i, j int) bool {
		return resp.DesiredLrps[i].GetProcessGuid() < resp.DesiredLrps[j].GetProcessGuid()
	})
	if p.structured() {
		return p.doc(resp, lrpsRoutes...)
	}
	headers := []string{"PROCESS_GUID", "DOMAIN", "INSTANCES", "ROOTFS", "MEMORY", "DISK", "ROUTES"}
	if p.wide() {
		headers = append(headers, "PORTS", "LABELS", "PLACEMENT", "ANNOTATION")
	}
	t := p.table(headers...)
	for _, d := range resp.GetDesiredLrps() {
		r := []any{d.GetProcessGuid(), d.GetDomain(), d.GetInstances(), d.GetRootfs(),
			fmt.Sprintf("%dM", d.GetMemoryMb()), fmt.Sprintf("%dM", d.GetDiskMb()), join(sortedKeys(d.GetRoutes()))}
		if p.wide() {
			r = append(r, joinPorts(d.GetPorts()), mapString(d.GetLabels()), constraintString(d.GetPlacementConstraint()), d.GetAnnotation())
		}
		t.row(r...)
	}
	return t.flush()
}

// printDesiredLRP renders one LRP: its fields, then its instances (with their latest
// resource samples, by instance guid, when metrics is not nil).
func printDesiredLRP(p *printer, d *modelsv1.DesiredLRP, actuals []*modelsv1.ActualLRP, metrics map[string]*repv1.ContainerMetrics) error {
	t := p.table("FIELD", "VALUE")
	t.row("process_guid", d.GetProcessGuid())
	t.row("domain", d.GetDomain())
	t.row("rootfs", d.GetRootfs())
	t.row("instances", d.GetInstances())
	t.row("resources", fmt.Sprintf("memory %dM, disk %dM, max_pids %d", d.GetMemoryMb(), d.GetDiskMb(), d.GetMaxPids()))
	t.row("ports", joinPorts(d.GetPorts()))
	t.row("placement", constraintString(d.GetPlacementConstraint()))
	t.row("labels", mapString(d.GetLabels()))
	t.row("annotation", d.GetAnnotation())
	for _, name := range sortedKeys(d.GetRoutes()) {
		t.row("routes."+name, string(d.GetRoutes()[name]))
	}
	if err := t.flush(); err != nil {
		return err
	}
	fmt.Fprintln(p.out)
	return printInstances(p, actuals, metrics)
}

// printActualLRPs renders instances, sorted by guid, index and presence.
func printActualLRPs(p *printer, actuals []*modelsv1.ActualLRP) error {
	return printInstances(p, actuals, nil)
}

// printInstances renders instances, sorted by guid, index and presence, with CPU, MEMORY and
// DISK columns when metrics (by instance guid) is not nil.
func printInstances(p *printer, actuals []*modelsv1.ActualLRP, metrics map[string]*repv1.ContainerMetrics) error {
	sorted := append([]*modelsv1.ActualLRP(nil), actuals...)
	sortActualLRPs(sorted)
	headers := []string{"PROCESS_GUID", "INDEX", "STATE", "CELL", "ADDRESS", "AGE", "DETAILS"}
	if metrics != nil {
		headers = append(headers, "CPU", "MEMORY", "DISK")
	}
	if p.wide() {
		headers = append(headers, "PRESENCE", "INSTANCE_GUID", "ZONE", "CRASHES", "ROUTABLE")
	}
	t := p.table(headers...)
	for _, a := range sorted {
		r := []any{a.GetKey().GetProcessGuid(), a.GetKey().GetIndex(), actualState(a), a.GetInstanceKey().GetCellId(),
			addressString(a.GetNetInfo()), p.age(a.GetSince()), actualDetails(a)}
		if metrics != nil {
			cpu, mem, disk := "", "", ""
			if m := metrics[a.GetInstanceKey().GetInstanceGuid()]; m != nil && a.GetInstanceKey().GetInstanceGuid() != "" {
				cpu, mem, disk = metricsColumns(m)
			}
			r = append(r, cpu, mem, disk)
		}
		if p.wide() {
			r = append(r, trimEnum(a.GetPresence().String(), "PRESENCE_"), a.GetInstanceKey().GetInstanceGuid(), a.GetZone(),
				a.GetCrashCount(), strconv.FormatBool(a.GetRoutable()))
		}
		t.row(r...)
	}
	return t.flush()
}

// sortActualLRPs orders instances by process guid, index and presence (stable output).
func sortActualLRPs(actuals []*modelsv1.ActualLRP) {
	sort.SliceStable(actuals, func(i, j int) bool {
		a, b := actuals[i].GetKey(), actuals[j].GetKey()
		if a.GetProcessGuid() != b.GetProcessGuid() {
			return a.GetProcessGuid() < b.GetProcessGuid()
		}
		if a.GetIndex() != b.GetIndex() {
			return a.GetIndex() < b.GetIndex()
		}
		return actuals[i].GetPresence() < actuals[j].GetPresence()
	})
}

// actualState is the coloured state; EVACUATING and SUSPECT copies say so.
func actualState(a *modelsv1.ActualLRP) cell {
	s := trimEnum(a.GetState().String(), "STATE_")
	if pr := a.GetPresence(); pr == modelsv1.ActualLRP_PRESENCE_EVACUATING || pr == modelsv1.ActualLRP_PRESENCE_SUSPECT {
		s += "/" + trimEnum(pr.String(), "PRESENCE_")
	}
	if a.GetDrainingSince() != nil {
		return cell{s + "/DRAINING", yellow} // unrouted, stopped once drained
	}
	switch a.GetState() {
	case modelsv1.ActualLRP_STATE_RUNNING:
		return cell{s, green}
	case modelsv1.ActualLRP_STATE_CRASHED:
		return cell{s, red}
	case modelsv1.ActualLRP_STATE_UNCLAIMED:
		if a.GetPlacementError() != nil {
			return cell{s, red}
		}
	}
	return cell{s, yellow}
}

// actualDetails is the placement error or the last crash, if any.
func actualDetails(a *modelsv1.ActualLRP) string {
	if pe := a.GetPlacementError(); pe != nil && pe.GetCode() != modelsv1.PlacementError_CODE_UNSPECIFIED {
		return trimEnum(pe.GetCode().String(), "CODE_") + ": " + pe.GetMessage()
	}
	if a.GetCrashCount() > 0 {
		return fmt.Sprintf("crashed %d×: %s", a.GetCrashCount(), a.GetCrashReason())
	}
	return ""
}

// addressString is address:host_port of the first port mapping.
func addressString(n *modelsv1.ActualLRPNetInfo) string {
	if n.GetAddress() == "" {
		return ""
	}
	var ports []string
	for _, pm := range n.GetPorts() {
		ports = append(ports, fmt.Sprintf("%d→%d", pm.GetHostPort(), pm.GetContainerPort()))
	}
	if len(ports) == 0 {
		return n.GetAddress()
	}
	return n.GetAddress() + ":" + strings.Join(ports, ",")
}

func joinPorts(ports []uint32) string {
	s := make([]string, len(ports))
	for i, p := range ports {
		s[i] = strconv.FormatUint(uint64(p), 10)
	}
	return strings.Join(s, ",")
}

// constraintString renders require/disallow tags.
func constraintString(pc *modelsv1.PlacementConstraint) string {
	var parts []string
	if r := pc.GetRequire(); len(r) > 0 {
		parts = append(parts, "require "+join(r))
	}
	if d := pc.GetDisallow(); len(d) > 0 {
		parts = append(parts, "disallow "+join(d))
	}
	return strings.Join(parts, "; ")
}

// trimEnum drops an enum value's prefix.
func trimEnum(s, prefix string) string { return strings.TrimPrefix(s, prefix) }

// sortedKeys returns a map's keys in order.
func sortedKeys[V any](m map[string]V) []string {
	keys := make([]string, 0, len(m))
	for k := range m {
		keys = append(keys, k)
	}
	sort.Strings(keys)
	return keys
}
