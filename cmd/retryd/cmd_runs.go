package main

import (
	"fmt"
	"strconv"
	"strings"
	"time"

	"github.com/spf13/cobra"

	"github.com/retryd/retryd/services/triggers"
)

// The runs commands work the triggers service's run views (GET /v1/runs,
// GET /v1/runs/{id}): the workflow runs triggers launched, their retry
// state and their steps. A run's manual retry is the scheduler's, as for
// any kind: POST /v1/retries/run/{id}/retry.

// runStatuses are the statuses of a workflow run; permanently_failed is
// the API's alias of failed and failed_max_retries.
var runStatuses = []string{"requested", "in_progress", "retrying", "completed", "failed", "failed_max_retries", "permanently_failed"}

// runFailedStatuses are those of a run that failed: the ones a manual
// retry is for.
var runFailedStatuses = []string{"retrying", "failed", "failed_max_retries"}

func newRunsCmd(g *globals) *cobra.Command {
	cmd := group(&cobra.Command{
		Use:     "runs",
		Aliases: []string{"run"},
		Short:   "List and inspect the workflow runs triggers launched; retry a failed run",
	})
	cmd.AddCommand(newRunsListCmd(g), newRunsShowCmd(g), newRunsRetryCmd(g))
	return cmd
}

func newRunsListCmd(g *globals) *cobra.Command {
	var (
		statuses                      []string
		workflow, trigger, errorClass string
		pages                         *pager
	)
	cmd := &cobra.Command{
		Use:   "list",
		Short: "List workflow runs by workflow, trigger, status and last error class, newest first",
		Example: `  retryd runs list --status retrying
  retryd runs list --workflow onboard --status permanently_failed --all
  retryd runs list --error-class timeout --json`,
		Args: args(0),
		RunE: func(cmd *cobra.Command, _ []string) error {
			if err := checkStatuses(cmd, statuses, runStatuses); err != nil {
				return err
			}
			q := filterQuery(map[string]string{"workflow": workflow, "trigger_id": trigger, "error_class": errorClass,
				"status": strings.Join(statuses, ",")})
			return list(cmd, g, pages, q, listing[runPage, triggers.RunView]{
				path: "/v1/runs", what: "runs", none: "No runs match.", more: "runs",
				rows:    func(p runPage) ([]triggers.RunView, string) { return p.Runs, p.NextCursor },
				page:    func(rows []triggers.RunView) runPage { return runPage{Runs: rows} },
				columns: []string{"ID", "WORKFLOW", "STATUS", "ATTEMPT", "RETRIES", "NODE", "LAST ERROR CLASS", "NEXT RETRY", "REQUESTED"},
				row: func(r triggers.RunView, now time.Time) []string {
					return []string{r.ID, r.Workflow, r.Status, strconv.Itoa(r.Attempt), retriesCell(r.RetryCount, r.MaxRetries), r.CurrentNodeID, r.LastErrorClass,
						runNextRetry(r, now), relTime(&r.RequestedAt, now)}
				},
			})
		},
	}
	f := cmd.Flags()
	f.StringVar(&workflow, "workflow", "", "workflow name")
	f.StringVar(&trigger, "trigger", "", "id of the trigger that launched the runs")
	f.StringSliceVar(&statuses, "status", nil, "run statuses: "+strings.Join(runStatuses, ", ")+" (repeat or comma-separate)")
	f.StringVar(&errorClass, "error-class", "", "class of the last error, e.g. timeout")
	pages = addPager(cmd, 500)
	return cmd
}

// runNextRetry is when a retrying run comes back; next_retry_at of a run
// that moved on is history, not a plan.
func runNextRetry(r triggers.RunView, now time.Time) string {
	if r.Status != "retrying" {
		return ""
	}
	return relTime(r.NextRetryAt, now)
}

func newRunsShowCmd(g *globals) *cobra.Command {
	return &cobra.Command{
		Use:     "show ID",
		Short:   "Show one workflow run, its retry state and its steps",
		Example: `  retryd runs show run-7K2Q8M9X3T7V5W6Y4Z2B1C0DAB`,
		Args:    args(1, "ID"),
		RunE:    showByID(g, "/v1/runs/", "run", func(_ string, v runView) error { return printRun(g, v) }),
	}
}

func printRun(g *globals, v runView) error {
	now := time.Now()
	r := v.Run
	pairs := []string{"ID", r.ID, "Workflow", r.Workflow, "Status", r.Status, "Attempt", strconv.Itoa(r.Attempt)}
	pairs = append(pairs, budgetPairs(r.RetryCount, r.MaxRetries, r.RetryEnabled, "run")...)
	if next := runNextRetry(r, now); next != "" {
		pairs = append(pairs, "Next retry", stamp(r.NextRetryAt, now))
	}
	if r.CurrentNodeID != "" {
		pairs = append(pairs, "Current node", r.CurrentNodeID)
	}
	pairs = append(pairs, lastErrorPairs(r.LastErrorClass, r.LastErrorMessage, r.LastErrorTimestamp, now)...)
	if r.Error != "" {
		pairs = append(pairs, "Error", r.Error)
	}
	if r.Executor != "" {
		pairs = append(pairs, "Executor", r.Executor)
	}
	for _, p := range [][2]string{{"Trigger", r.TriggerID}, {"Delivery", r.DeliveryID}, {"Event", r.EventID}} {
		if p[1] != "" {
			pairs = append(pairs, p[0], p[1])
		}
	}
	pairs = append(pairs, "Requested", stamp(&r.RequestedAt, now), "Updated", stamp(&r.UpdatedAt, now))
	if r.LeaseExpiresAt != nil && r.FinishedAt == nil && (r.Status == "requested" || r.Status == "in_progress") {
		pairs = append(pairs, "Lease until", stamp(r.LeaseExpiresAt, now))
	}
	if r.FinishedAt != nil {
		pairs = append(pairs, "Finished", stamp(r.FinishedAt, now))
	}
	if err := keyValues(g.stdout, pairs...); err != nil {
		return err
	}
	fmt.Fprintf(g.stdout, "\nSteps (%d):\n", len(v.Steps))
	if len(v.Steps) == 0 {
		fmt.Fprintln(g.stdout, "  (no step reported yet)")
	} else if err := printRunSteps(g, v.Steps, now); err != nil {
		return err
	}
	// Why it retried is the scheduler's history of the run.
	if contains(runFailedStatuses, r.Status) || r.RetryCount > 0 {
		fmt.Fprintf(g.stdout, "\nWhy it retried: retryd retries show run %s\n", r.ID)
	}
	return nil
}

func printRunSteps(g *globals, steps []triggers.StepView, now time.Time) error {
	t := newTable(g.stdout, "NODE", "STATUS", "ATTEMPTS", "RUN ATTEMPT", "RETRY STATE", "EXECUTOR", "ERROR", "OUTPUT")
	for _, s := range steps {
		retry := s.RetryState
		if s.RetryState == "scheduled" && s.NextAttemptAt != nil {
			retry += " " + relTime(s.NextAttemptAt, now)
		}
		out := ""
		if len(s.Output) > 0 && string(s.Output) != "null" {
			out = string(s.Output)
		}
		t.row(s.Node, s.Status, strconv.Itoa(s.Attempts), strconv.Itoa(s.RunAttempt), retry, s.Executor,
			trunc(strings.TrimPrefix(s.LastErrorClass+": "+s.LastErrorMessage, ": "), 60), trunc(out, 60))
	}
	return t.flush()
}

func newRunsRetryCmd(g *globals) *cobra.Command {
	var reason string
	var reset bool
	cmd := &cobra.Command{
		Use:   "retry ID",
		Short: "Retry a failed workflow run now, from its checkpoint (the scheduler's retry of kind run)",
		Long: `retry asks the scheduler to retry the run now (POST /v1/retries/run/ID/retry):
the run comes back from its last completed node, recorded as decided_by
manual. Only a run that failed has a retry at the scheduler: one that is
retrying, failed or failed_max_retries.`,
		Example: `  retryd runs retry run-7K2Q8M9X3T7V5W6Y4Z2B1C0DAB --reason "crm back up"
  retryd runs retry run-7K2Q8M9X3T7V5W6Y4Z2B1C0DAB --reset-attempts`,
		Args: args(1, "ID"),
		RunE: func(cmd *cobra.Command, a []string) error {
			id := a[0]
			var v retryView
			if done, err := g.send(cmd, "/v1/retries/run/"+seg(id)+"/retry", actionBody(reason, reset), &v,
				func(err error) error { return runRetryErr(cmd, g, id, err) }); done {
				return err
			}
			fmt.Fprintf(g.stdout, "Retry of run %s accepted: attempt %d is scheduled now, decided_by manual.\n", id, v.Retry.Attempt)
			fmt.Fprintf(g.stdout, "Its status follows in a moment: retryd runs show %s\n", id)
			return nil
		},
	}
	cmd.Flags().StringVar(&reason, "reason", "", "why (recorded in the run's retry history)")
	cmd.Flags().BoolVar(&reset, "reset-attempts", false, "give the run its whole retry budget again")
	return cmd
}

// runRetryErr explains a failed run retry. The scheduler answers 404 for
// a run it has no retry of: say whether the run exists and why it has
// none.
func runRetryErr(cmd *cobra.Command, g *globals, id string, err error) error {
	if isNotFound(err) {
		var rv runView
		c, cerr := g.client()
		if cerr != nil {
			return cerr
		}
		if _, gerr := c.get(cmd.Context(), "/v1/runs/"+seg(id), nil, &rv); gerr == nil {
			return fmt.Errorf("retry run %s: it is %s and has no retry at the scheduler: only a run that failed (%s) can be retried",
				id, rv.Run.Status, strings.Join(runFailedStatuses, ", "))
		} else if isNotFound(gerr) {
			return fmt.Errorf("retry run %s: no such run", id)
		}
	}
	return idErr("retry run", id, err)
}
