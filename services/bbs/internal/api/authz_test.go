package api

import (
	"testing"

	"github.com/gavel-sched/gavel/pkg/authz"
)

// TestRoutineCallsOfThePolicy checks which BBS calls the policy leaves out of the audit log
// when they succeed: a rep's lifecycle reports on its cell and the route-emitter's published
// revision, not a rep's evacuation, nsync's desires or any call of admin.
func TestRoutineCallsOfThePolicy(t *testing.T) {
	p := Policy(authz.Config{}, Lookup{})
	rep := authz.Role{Kind: authz.Rep, Param: "cell-1"}
	for _, c := range []struct {
		role   authz.Role
		method string
		want   bool
	}{
		{rep, "ClaimActualLRP", true},
		{rep, "StartActualLRPs", true},
		{rep, "CrashActualLRP", true},
		{rep, "CompleteTask", true},
		{rep, "EvacuateRunningActualLRP", false},
		{authz.Role{Kind: authz.RouteEmitter}, "ReportRoutesPublished", true},
		{authz.Role{Kind: authz.Nsync}, "DesireLRP", false},
		{authz.Role{Kind: authz.Admin}, "ClaimActualLRP", false},
		{authz.Role{Kind: authz.Auctioneer}, "FailActualLRP", false},
	} {
		if got := p.Routine(c.role, "/gavel.bbs.v1.BBSService/"+c.method); got != c.want {
			t.Errorf("Routine(%s, %s) = %v, want %v", c.role, c.method, got, c.want)
		}
	}
}
