package transform

import (
	"errors"
	"fmt"
	"slices"
	"strings"

	"google.golang.org/protobuf/proto"

	modelsv1 "github.com/gavel-sched/gavel/pkg/gen/gavel/models/v1"
	"github.com/gavel-sched/gavel/pkg/models"
	"github.com/gavel-sched/gavel/pkg/rpcerr"
)

// fieldError is an invalid answer: the first offending field and every violation.
type fieldError struct {
	field string
	msg   string
}

func toFieldError(e *rpcerr.InvalidError) *fieldError {
	if e.Err() == nil {
		return nil
	}
	parts := make([]string, len(e.Violations))
	for i, v := range e.Violations {
		parts[i] = v.Field + ": " + v.Reason
	}
	return &fieldError{field: e.Violations[0].Field, msg: strings.Join(parts, "; ")}
}

const mayNot = "a transformer may not change it"

// checkDesiredLRP validates a plugin's answer for a desired LRP: same guid and domain, the
// immutable rootfs, ports and placement_constraint unchanged, and the whole model valid.
func checkDesiredLRP(in, out *modelsv1.DesiredLRP, l models.Limits) *fieldError {
	e := &rpcerr.InvalidError{}
	if out.GetProcessGuid() != in.GetProcessGuid() {
		e.Add("desired_lrp.process_guid", "changed from %q to %q; %s", in.GetProcessGuid(), out.GetProcessGuid(), mayNot)
	}
	if out.GetDomain() != in.GetDomain() {
		e.Add("desired_lrp.domain", "changed from %q to %q; %s", in.GetDomain(), out.GetDomain(), mayNot)
	}
	if out.GetRootfs() != in.GetRootfs() {
		e.Add("desired_lrp.rootfs", "is immutable: changed from %q to %q", in.GetRootfs(), out.GetRootfs())
	}
	if !slices.Equal(out.GetPorts(), in.GetPorts()) {
		e.Add("desired_lrp.ports", "is immutable: changed from %v to %v", in.GetPorts(), out.GetPorts())
	}
	if !models.SameConstraint(in.GetPlacementConstraint(), out.GetPlacementConstraint()) {
		e.Add("desired_lrp.placement_constraint", "is immutable: changed from %s to %s",
			formatConstraint(in.GetPlacementConstraint()), formatConstraint(out.GetPlacementConstraint()))
	}
	if e.Err() == nil {
		e.Merge("desired_lrp", models.ValidateDesiredLRP("desired_lrp", out, l))
	}
	return toFieldError(e)
}

// checkTask validates a plugin's answer for a task: only the definition may change, its rootfs
// and placement_constraint stay, and the definition is valid.
func checkTask(in, out *modelsv1.Task, l models.Limits) *fieldError {
	e := &rpcerr.InvalidError{}
	if out.GetTaskGuid() != in.GetTaskGuid() {
		e.Add("task.task_guid", "changed from %q to %q; %s", in.GetTaskGuid(), out.GetTaskGuid(), mayNot)
	}
	if out.GetDomain() != in.GetDomain() {
		e.Add("task.domain", "changed from %q to %q; %s", in.GetDomain(), out.GetDomain(), mayNot)
	}
	inRest, outRest := proto.Clone(in).(*modelsv1.Task), proto.Clone(out).(*modelsv1.Task)
	for _, t := range []*modelsv1.Task{inRest, outRest} {
		t.TaskGuid, t.Domain, t.Definition = "", "", nil
	}
	if f := firstDiff(inRest, outRest); f != "" {
		e.Add("task."+f, "changed; a transformer may change only task.definition")
	}
	if out.GetDefinition().GetRootfs() != in.GetDefinition().GetRootfs() {
		e.Add("task.definition.rootfs", "is immutable: changed from %q to %q", in.GetDefinition().GetRootfs(), out.GetDefinition().GetRootfs())
	}
	if !models.SameConstraint(in.GetDefinition().GetPlacementConstraint(), out.GetDefinition().GetPlacementConstraint()) {
		e.Add("task.definition.placement_constraint", "is immutable: changed from %s to %s",
			formatConstraint(in.GetDefinition().GetPlacementConstraint()), formatConstraint(out.GetDefinition().GetPlacementConstraint()))
	}
	if e.Err() == nil {
		e.Merge("task.definition", models.ValidateTaskDefinition("task.definition", out.GetDefinition(), l))
	}
	return toFieldError(e)
}

func formatConstraint(c *modelsv1.PlacementConstraint) string {
	return fmt.Sprintf("{require: %q, disallow: %q}", c.GetRequire(), c.GetDisallow())
}

// firstDiff names the first top-level field (in field-number order) whose value differs
// between two messages of the same type, or "" when they are equal.
func firstDiff(a, b proto.Message) string {
	if proto.Equal(a, b) {
		return ""
	}
	ra, rb := a.ProtoReflect(), b.ProtoReflect()
	fields := ra.Descriptor().Fields()
	for i := range fields.Len() {
		fd := fields.Get(i)
		na, nb := ra.New(), rb.New()
		if ra.Has(fd) {
			na.Set(fd, ra.Get(fd))
		}
		if rb.Has(fd) {
			nb.Set(fd, rb.Get(fd))
		}
		if !proto.Equal(na.Interface(), nb.Interface()) {
			return string(fd.Name())
		}
	}
	return "(unknown fields)"
}

// IsPluginError reports whether err is (or wraps) a plugin failure, as opposed to the caller's
// context ending.
func IsPluginError(err error) bool {
	var e *Error
	return errors.As(err, &e)
}
