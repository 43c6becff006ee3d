package main

import (
	"fmt"
	"sort"
	"strconv"

	"github.com/spf13/cobra"

	bbsv1 "github.com/gavel-sched/gavel/pkg/gen/gavel/bbs/v1"
	modelsv1 "github.com/gavel-sched/gavel/pkg/gen/gavel/models/v1"
)

// taskCommands are the task commands. desire-task reads a DesireTaskRequest document:
// {taskGuid, domain, definition: {...}}.
func (c *cli) taskCommands() []*cobra.Command {
	var f bbsv1.Filter
	var wf watchFlags
	tasks := &cobra.Command{
		Use:   "tasks",
		Short: "List tasks",
		Args:  cobra.NoArgs,
		RunE: func(cmd *cobra.Command, _ []string) error {
			return c.listBBS(cmd, wf, func(p *printer, bbs bbsv1.BBSServiceClient) error {
				resp, err := bbs.Tasks(cmd.Context(), &bbsv1.TasksRequest{Filter: &f})
				if err != nil {
					return err
				}
				sort.Slice(resp.Tasks, func(i, j int) bool { return resp.Tasks[i].GetTaskGuid() < resp.Tasks[j].GetTaskGuid() })
				if p.structured() {
					return p.doc(resp)
				}
				return printTasks(p, resp.GetTasks())
			})
		},
	}
	filterFlags(tasks, &f, true)
	wf.bind(tasks)

	task := &cobra.Command{
		Use:               "task GUID",
		Short:             "Show a task",
		Args:              cobra.ExactArgs(1),
		ValidArgsFunction: c.completeFrom(taskGuids),
		RunE: func(cmd *cobra.Command, args []string) error {
			p, bbs, err := c.clients()
			if err != nil {
				return err
			}
			resp, err := bbs.TaskByGuid(cmd.Context(), &bbsv1.TaskByGuidRequest{TaskGuid: args[0]})
			if err != nil {
				return err
			}
			if p.structured() {
				return p.doc(resp.GetTask())
			}
			t := resp.GetTask()
			tb := p.table("FIELD", "VALUE")
			tb.row("task_guid", t.GetTaskGuid())
			tb.row("domain", t.GetDomain())
			tb.row("state", taskState(t))
			tb.row("cell", t.GetCellId())
			tb.row("rootfs", t.GetDefinition().GetRootfs())
			tb.row("resources", fmt.Sprintf("memory %dM, disk %dM", t.GetDefinition().GetMemoryMb(), t.GetDefinition().GetDiskMb()))
			tb.row("placement", constraintString(t.GetDefinition().GetPlacementConstraint()))
			tb.row("failure_reason", t.GetFailureReason())
			tb.row("result", t.GetResult())
			tb.row("rejections", t.GetRejectionCount())
			tb.row("placement_error", placementString(t.GetPlacementError()))
			tb.row("age", p.age(t.GetCreatedAt()))
			return tb.flush()
		},
	}

	desire := &cobra.Command{
		Use:   "desire-task FILE",
		Short: "Desire a task from a YAML or JSON file: {taskGuid, domain, definition: {...}}",
		Args:  cobra.ExactArgs(1),
		RunE: func(cmd *cobra.Command, args []string) error {
			var req bbsv1.DesireTaskRequest
			if _, err := readDocument(args[0], &req, ""); err != nil {
				return withExit(exitUsage, err)
			}
			bbs, err := c.bbsClient()
			if err != nil {
				return err
			}
			resp, err := bbs.DesireTask(cmd.Context(), &req)
			if err != nil {
				return fmt.Errorf("desire task %s: %w", req.GetTaskGuid(), err)
			}
			fmt.Fprintf(c.err, "desired task %s at revision %d\n", req.GetTaskGuid(), resp.GetRevision())
			return nil
		},
	}

	cancel := &cobra.Command{
		Use:               "cancel-task GUID",
		Short:             "Cancel a task (it completes as failed)",
		Args:              cobra.ExactArgs(1),
		ValidArgsFunction: c.completeFrom(taskGuids),
		RunE: func(cmd *cobra.Command, args []string) error {
			bbs, err := c.bbsClient()
			if err != nil {
				return err
			}
			if _, err := bbs.CancelTask(cmd.Context(), &bbsv1.CancelTaskRequest{TaskGuid: args[0]}); err != nil {
				return fmt.Errorf("cancel task %s: %w", args[0], err)
			}
			fmt.Fprintf(c.err, "cancelled task %s\n", args[0])
			return nil
		},
	}

	del := &cobra.Command{
		Use:               "delete-task GUID",
		Short:             "Delete a completed task (resolving it first)",
		Args:              cobra.ExactArgs(1),
		ValidArgsFunction: c.completeFrom(taskGuids),
		RunE: func(cmd *cobra.Command, args []string) error {
			bbs, err := c.bbsClient()
			if err != nil {
				return err
			}
			t, err := bbs.TaskByGuid(cmd.Context(), &bbsv1.TaskByGuidRequest{TaskGuid: args[0]})
			if err != nil {
				return fmt.Errorf("delete task %s: %w", args[0], err)
			}
			if t.GetTask().GetState() == modelsv1.Task_STATE_COMPLETED {
				if _, err := bbs.ResolvingTask(cmd.Context(), &bbsv1.ResolvingTaskRequest{TaskGuid: args[0]}); err != nil {
					return fmt.Errorf("delete task %s: resolve: %w", args[0], err)
				}
			}
			if _, err := bbs.DeleteTask(cmd.Context(), &bbsv1.DeleteTaskRequest{TaskGuid: args[0]}); err != nil {
				return fmt.Errorf("delete task %s: %w", args[0], err)
			}
			fmt.Fprintf(c.err, "deleted task %s\n", args[0])
			return nil
		},
	}
	return []*cobra.Command{tasks, task, desire, cancel, del}
}

// printTasks renders tasks sorted by guid.
func printTasks(p *printer, tasks []*modelsv1.Task) error {
	sorted := append([]*modelsv1.Task(nil), tasks...)
	sort.Slice(sorted, func(i, j int) bool { return sorted[i].GetTaskGuid() < sorted[j].GetTaskGuid() })
	headers := []string{"TASK_GUID", "DOMAIN", "STATE", "CELL", "AGE", "DETAILS"}
	if p.wide() {
		headers = append(headers, "ROOTFS", "MEMORY", "REJECTIONS", "RESULT")
	}
	t := p.table(headers...)
	for _, k := range sorted {
		details := k.GetFailureReason()
		if pe := placementString(k.GetPlacementError()); pe != "" {
			details = pe
		}
		r := []any{k.GetTaskGuid(), k.GetDomain(), taskState(k), k.GetCellId(), p.age(k.GetCreatedAt()), details}
		if p.wide() {
			r = append(r, k.GetDefinition().GetRootfs(), fmt.Sprintf("%dM", k.GetDefinition().GetMemoryMb()),
				strconv.Itoa(int(k.GetRejectionCount())), k.GetResult())
		}
		t.row(r...)
	}
	return t.flush()
}

// taskState is the coloured state; a failed completion says FAILED.
func taskState(t *modelsv1.Task) cell {
	s := trimEnum(t.GetState().String(), "STATE_")
	switch t.GetState() {
	case modelsv1.Task_STATE_COMPLETED, modelsv1.Task_STATE_RESOLVING:
		if t.GetFailed() {
			return cell{s + "/FAILED", red}
		}
		return cell{s, green}
	case modelsv1.Task_STATE_RUNNING:
		return cell{s, cyan}
	}
	return cell{s, yellow}
}

// placementString renders a placement error, or "" for none.
func placementString(pe *modelsv1.PlacementError) string {
	if pe == nil || pe.GetCode() == modelsv1.PlacementError_CODE_UNSPECIFIED {
		return ""
	}
	return trimEnum(pe.GetCode().String(), "CODE_") + ": " + pe.GetMessage()
}
