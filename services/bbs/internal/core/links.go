package core

import (
	"errors"
	"fmt"
	"strings"

	"google.golang.org/protobuf/proto"

	bbsv1 "github.com/gavel-sched/gavel/pkg/gen/gavel/bbs/v1"
	modelsv1 "github.com/gavel-sched/gavel/pkg/gen/gavel/models/v1"
	"github.com/gavel-sched/gavel/pkg/links"
	"github.com/gavel-sched/gavel/pkg/rpcerr"
)

// checkLinks refuses (InvalidArgument, one violation per failing link) a desired LRP whose
// required links do not resolve against the cached providers.
func (c *DesiredLRPs) checkLinks(d *modelsv1.DesiredLRP) error {
	if len(d.GetLinks().GetConsumes()) == 0 {
		return nil
	}
	return linkViolations(c.st.CheckLinks(links.FromDesired(d)))
}

func linkViolations(err error) error {
	var le *links.Error
	if !errors.As(err, &le) {
		return err
	}
	inv := &rpcerr.InvalidError{}
	for _, f := range le.Failures {
		inv.Add(fmt.Sprintf("desired_lrp.links.consumes[%d]", f.Index), "%s", f)
	}
	return inv
}

// checkUpdatedLinks refuses (as checkLinks refuses a desire) the result of an update whose
// required links do not resolve, whether the stored links stopped resolving (their provider was
// removed with force) or a transformer plugin changed them. Scaling to zero with the stored
// links unchanged is always allowed, so a consumer whose provider is gone can be stopped.
func (c *DesiredLRPs) checkUpdatedLinks(stored *modelsv1.DesiredLRPRunInfo, result *modelsv1.DesiredLRP, u *modelsv1.DesiredLRPUpdate) error {
	if u.Instances != nil && u.GetInstances() == 0 && proto.Equal(stored.GetLinks(), result.GetLinks()) {
		return nil
	}
	return c.checkLinks(result)
}

// checkNotConsumed refuses to remove a provider that other LRPs consume, unless forced.
func (c *DesiredLRPs) checkNotConsumed(guid string, force bool) error {
	if force {
		return nil
	}
	if cs := c.st.LinkConsumersOf(guid); len(cs) > 0 {
		return rpcerr.FailedPrecondition("desired lrp %q provides links consumed by %s; remove them first or remove with force", guid, quoteAll(cs))
	}
	return nil
}

func quoteAll(ss []string) string {
	q := make([]string, len(ss))
	for i, s := range ss {
		q[i] = fmt.Sprintf("%q", s)
	}
	return strings.Join(q, ", ")
}

// ResolveLinks resolves the links a desired LRP consumes from the cache: LRP-wide, or for an
// instance on cellID when it is set, and per placed instance when the LRP consumes a colocated
// link. A required link that does not resolve (its provider was removed with force) is
// FailedPrecondition listing every failure.
func (c *DesiredLRPs) ResolveLinks(guid, cellID string) (*bbsv1.ResolveLinksResponse, error) {
	colocated := false
	r, ok := c.st.ResolveLinks(guid, cellID, false)
	if !ok {
		return nil, rpcerr.NotFound("desired lrp %q not found", guid)
	}
	for _, cl := range r.LRP.Links.GetConsumes() {
		colocated = colocated || cl.GetColocated()
	}
	if colocated {
		r, _ = c.st.ResolveLinks(guid, cellID, true)
	}
	if r.Err != nil {
		return nil, rpcerr.FailedPrecondition("%v", r.Err)
	}
	out := &bbsv1.ResolveLinksResponse{Links: r.Resolution.Links, Revision: r.Revision}
	for _, ir := range r.Instances {
		if ir.Err != nil {
			return nil, rpcerr.FailedPrecondition("%v", ir.Err)
		}
		out.Instances = append(out.Instances, &modelsv1.InstanceLinks{
			Index: ir.Index, InstanceGuid: ir.InstanceGuid, CellId: ir.CellID, Links: ir.Resolution.Links,
		})
	}
	return out, nil
}
