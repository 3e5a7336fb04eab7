package main

import (
	"encoding/json"
	"fmt"
	"io"
	"strconv"
	"strings"
	"time"

	"github.com/spf13/cobra"

	"github.com/retryd/retryd/pkg/contract"
	"github.com/retryd/retryd/stores/jobstore"
)

// The jobs commands work the jobs API (services/jobs): the jobs table the
// projection keeps, one job's history, actions on one job and bulk
// retries. `retries` works every kind through the scheduler's API; these
// speak in job statuses (failed_max_retries, held, ...) instead.

func newJobsCmd(g *globals) *cobra.Command {
	cmd := group(&cobra.Command{
		Use:     "jobs",
		Aliases: []string{"job"},
		Short:   "Enqueue, list, inspect, retry and cancel jobs; bulk retries and their progress",
	})
	cmd.AddCommand(newJobsListCmd(g), newJobsShowCmd(g), newJobsEnqueueCmd(g), newJobsActionCmd(g, "retry"), newJobsActionCmd(g, "cancel"),
		newJobsBulkRetryCmd(g), newJobsOperationCmd(g), newJobsOperationsCmd(g))
	return cmd
}

// checkStatuses reports the first of list (--status) that is not one of
// known: jobStatuses, or runStatuses for runs.
func checkStatuses(cmd *cobra.Command, list, known []string) error {
	for _, s := range list {
		if !contains(known, s) {
			return usageErrorf(cmd, "--status %q is not one of %s", s, strings.Join(known, ", "))
		}
	}
	return nil
}

// timeFlags reads --since and --until into dst under their API names.
func timeFlags(cmd *cobra.Command, since, until string, set func(name string, t time.Time)) error {
	now := time.Now()
	for _, p := range []struct{ name, v string }{{"since", since}, {"until", until}} {
		if p.v == "" {
			continue
		}
		t, err := parseTimeFlag(p.v, now)
		if err != nil {
			return usageErrorf(cmd, "--%s: %v", p.name, err)
		}
		set(p.name, t)
	}
	return nil
}

func newJobsListCmd(g *globals) *cobra.Command {
	var (
		statuses                          []string
		jobType, errorClass, since, until string
		priority                          string
		minRetries                        int
		pages                             *pager
	)
	cmd := &cobra.Command{
		Use:   "list",
		Short: "List jobs by type, status and last error class, most recently changed first",
		Example: `  retryd jobs list --status failed,failed_max_retries
  retryd jobs list --type send_email --error-class rate_limit --all
  retryd jobs list --status retrying --json`,
		Args: args(0),
		RunE: func(cmd *cobra.Command, _ []string) error {
			if err := checkStatuses(cmd, statuses, jobStatuses); err != nil {
				return err
			}
			if minRetries < 0 {
				return usageErrorf(cmd, "--min-retry-count must not be negative, got %d", minRetries)
			}
			q := filterQuery(map[string]string{"job_type": jobType, "error_class": errorClass, "status": strings.Join(statuses, ",")})
			if priority != "" {
				p, err := contract.ParsePriority("--priority", priority)
				if err != nil {
					return usageErrorf(cmd, "--priority must be high, normal or low, got %q", priority)
				}
				q.Set("priority", string(p))
			}
			if minRetries > 0 {
				q.Set("min_retry_count", strconv.Itoa(minRetries))
			}
			if err := timeFlags(cmd, since, until, func(name string, t time.Time) { q.Set(name, t.Format(time.RFC3339Nano)) }); err != nil {
				return err
			}
			return list(cmd, g, pages, q, listing[jobPage, jobstore.Job]{
				path: "/v1/jobs", what: "jobs", none: "No jobs match.", more: "jobs",
				rows: func(p jobPage) ([]jobstore.Job, string) { return p.Jobs, p.NextCursor },
				page: func(rows []jobstore.Job) jobPage { return jobPage{Jobs: rows} },
				// RETRIES, not attempts out of a maximum: the API has no
				// maximum attempt, and after --reset-attempts the attempt
				// number goes on while the budget starts again.
				columns: []string{"ID", "TYPE", "STATUS", "PRIORITY", "ATTEMPT", "RETRIES", "LAST ERROR CLASS", "NEXT RETRY", "UPDATED"},
				row: func(j jobstore.Job, now time.Time) []string {
					return []string{j.ID, j.JobType, string(j.Status), jobPriority(j), strconv.Itoa(j.Attempt), retriesCell(j.RetryCount, j.MaxRetries), j.LastErrorClass,
						nextRetry(j, now), relTime(&j.UpdatedAt, now)}
				},
			})
		},
	}
	f := cmd.Flags()
	f.StringVar(&jobType, "type", "", "job type")
	f.StringSliceVar(&statuses, "status", nil, "job statuses: "+strings.Join(jobStatuses, ", ")+" (repeat or comma-separate)")
	f.StringVar(&errorClass, "error-class", "", "class of the last error, e.g. rate_limit")
	f.StringVar(&priority, "priority", "", "priority band: high, normal or low")
	f.IntVar(&minRetries, "min-retry-count", 0, "jobs that used at least this many retries")
	f.StringVar(&since, "since", "", "changed at or after (RFC 3339, or a duration back from now such as 24h)")
	f.StringVar(&until, "until", "", "changed before (RFC 3339, or a duration back from now)")
	pages = addPager(cmd, 1000)
	return cmd
}

// nextRetry is when a waiting job runs again; next_retry_at of a finished
// job is history, not a plan.
func nextRetry(j jobstore.Job, now time.Time) string {
	if j.Status != "retrying" && j.Status != "held" {
		return ""
	}
	return relTime(j.NextRetryAt, now)
}

func newJobsShowCmd(g *globals) *cobra.Command {
	return &cobra.Command{
		Use:     "show ID",
		Short:   "Show one job and its attempt history",
		Example: `  retryd jobs show 01JA2Q8M9X3T7V5W6Y4Z2B1C0D`,
		Args:    args(1, "ID"),
		RunE:    showByID(g, "/v1/jobs/", "job", func(id string, v jobView) error { return printJob(g, id, v) }),
	}
}

// jobPriority is a job's band; an API from before priorities sends none,
// and its jobs are normal.
func jobPriority(j jobstore.Job) string {
	if j.Priority == "" {
		return string(contract.PriorityNormal)
	}
	return j.Priority
}

func printJob(g *globals, id string, v jobView) error {
	now := time.Now()
	if j := v.Job; j != nil {
		status := string(j.Status)
		if j.StatusReason != "" {
			status += " (" + j.StatusReason + ")"
		}
		pairs := []string{"ID", j.ID, "Type", j.JobType, "Status", status, "Priority", jobPriority(*j), "Attempt", strconv.Itoa(j.Attempt)}
		pairs = append(pairs, budgetPairs(j.RetryCount, j.MaxRetries, j.RetryEnabled, "job")...)
		if j.CurrentStep != "" {
			pairs = append(pairs, "Current step", j.CurrentStep)
		}
		pairs = append(pairs, lastErrorPairs(j.LastErrorClass, j.LastErrorMessage, j.LastErrorTimestamp, now)...)
		if j.LastAttemptAt != nil {
			pairs = append(pairs, "Last attempt", stamp(j.LastAttemptAt, now))
		}
		if next := nextRetry(*j, now); next != "" {
			pairs = append(pairs, "Next retry", stamp(j.NextRetryAt, now))
		}
		pairs = append(pairs, "Created", stamp(&j.CreatedAt, now), "Updated", stamp(&j.UpdatedAt, now))
		if j.CompletedAt != nil {
			pairs = append(pairs, "Completed", stamp(j.CompletedAt, now))
		}
		if err := keyValues(g.stdout, pairs...); err != nil {
			return err
		}
	} else {
		// The scheduler's history is written before the projection folds
		// the job, so a fresh job can have history and no row yet.
		fmt.Fprintf(g.stdout, "Job %s is not in the jobs table yet; its history:\n", id)
	}
	fmt.Fprintf(g.stdout, "\nAttempts (%d events):\n", len(v.History))
	if len(v.History) == 0 {
		fmt.Fprintln(g.stdout, "  (no history: the job never failed)")
		return nil
	}
	// EXECUTOR: the worker instance that ran the attempt (as in retries show).
	t := newTable(g.stdout, "TIME", "EVENT", "ATTEMPT", "EXECUTOR", "CLASS", "MESSAGE", "DELAY", "DECIDED BY")
	for _, h := range v.History {
		delay := ""
		if h.DelayMS != nil {
			delay = msDuration(*h.DelayMS)
		}
		t.row(h.At.Local().Format("2006-01-02 15:04:05.000"), h.Event, strconv.Itoa(h.Attempt), h.Executor, h.ErrorClass,
			trunc(historyDetail(h), 60), delay, h.DecidedBy)
	}
	return t.flush()
}

func newJobsActionCmd(g *globals, action string) *cobra.Command {
	var reason string
	var reset bool
	cmd := &cobra.Command{
		Use:  action + " ID",
		Args: args(1, "ID"),
		RunE: func(cmd *cobra.Command, a []string) error {
			id := a[0]
			var res jobActionView
			if done, err := g.send(cmd, "/v1/jobs/"+seg(id)+"/"+action, actionBody(reason, reset), &res,
				func(err error) error { return idErr(action+" job", id, err) }); done {
				return err
			}
			// 202: the scheduler recorded the action; the jobs table
			// follows once the projection folds the event.
			what := "Retry of job %s accepted: a new attempt is scheduled now"
			if action == "cancel" {
				what = "Cancelled job %s's pending retry"
			}
			fmt.Fprintf(g.stdout, what+" (by %s).\n", res.ID, res.By)
			fmt.Fprintf(g.stdout, "Its status follows in a moment: retryd jobs show %s\n", res.ID)
			return nil
		},
	}
	cmd.Flags().StringVar(&reason, "reason", "", "why (recorded in the job's history)")
	if action == "retry" {
		cmd.Short = "Retry a job now, from any status (failed and cancelled included)"
		cmd.Example = `  retryd jobs retry 01JA2Q8M9X3T7V5W6Y4Z2B1C0D --reason "token renewed"
  retryd jobs retry 01JA2Q8M9X3T7V5W6Y4Z2B1C0D --reset-attempts`
		cmd.Flags().BoolVar(&reset, "reset-attempts", false, "give the job its whole retry budget again")
	} else {
		cmd.Short = "Cancel a job's pending retry"
		cmd.Example = `  retryd jobs cancel 01JA2Q8M9X3T7V5W6Y4Z2B1C0D --reason "customer left"`
	}
	return cmd
}

// parseRate reads --rate as jobs per second: "5" or "5/s".
func parseRate(v string) (float64, error) {
	n, err := strconv.ParseFloat(strings.TrimSuffix(strings.TrimSpace(v), "/s"), 64)
	if err != nil || !(n > 0 && n <= 1000) {
		return 0, fmt.Errorf("--rate %q: want jobs per second above 0 and at most 1000, such as 5 or 5/s", v)
	}
	return n, nil
}

func newJobsOperationCmd(g *globals) *cobra.Command {
	var wait, cancel bool
	cmd := &cobra.Command{
		Use:     "operation ID",
		Aliases: []string{"op"},
		Short:   "Show a bulk retry's progress; --wait follows it, --cancel stops it",
		Example: `  retryd jobs operation op-01JA2Q8M9X3T7V5W6Y4Z2B1C0D
  retryd jobs operation op-01JA2Q8M9X3T7V5W6Y4Z2B1C0D --wait`,
		Args: args(1, "ID"),
		RunE: func(cmd *cobra.Command, a []string) error {
			id := a[0]
			if wait && cancel {
				return usageErrorf(cmd, "--wait and --cancel exclude each other")
			}
			c, err := g.client()
			if err != nil {
				return err
			}
			if wait {
				return followOperation(cmd, g, c, id)
			}
			var op operationView
			var raw json.RawMessage
			if cancel {
				raw, err = c.post(cmd.Context(), "/v1/operations/"+seg(id)+"/cancel", nil, &op)
			} else {
				raw, err = c.get(cmd.Context(), "/v1/operations/"+seg(id), nil, &op)
			}
			if err != nil {
				what := "show operation"
				if cancel {
					what = "cancel operation"
				}
				return idErr(what, id, err)
			}
			if g.json {
				return printJSON(g.stdout, raw)
			}
			printOperationProgress(g.stdout, op)
			return nil
		},
	}
	cmd.Flags().BoolVar(&wait, "wait", false, "follow the progress until the operation finished")
	cmd.Flags().BoolVar(&cancel, "cancel", false, "stop the operation: its pending jobs are not retried")
	return cmd
}

// followOperation polls an operation until it is no longer running,
// printing a progress line (on stderr, so that --json output stays one
// document) each time it moves, then the outcome. An operation that ends
// with failed jobs or cancelled is a failure: exit code 1.
func followOperation(cmd *cobra.Command, g *globals, c *apiClient, id string) error {
	tick := time.NewTicker(250 * time.Millisecond)
	defer tick.Stop()
	last := ""
	for {
		var op operationView
		raw, err := c.get(cmd.Context(), "/v1/operations/"+seg(id), nil, &op)
		if err != nil {
			return idErr("wait for operation", id, err)
		}
		o := op.Operation
		if o.Status != "running" {
			if g.json {
				if err := printJSON(g.stdout, raw); err != nil {
					return err
				}
			} else {
				printOperationProgress(g.stdout, op)
			}
			if o.Status != "completed" || o.Failed > 0 {
				return fmt.Errorf("bulk retry %s: %s with %d of %d job(s) failed", o.ID, o.Status, o.Failed, o.Total)
			}
			return nil
		}
		if p := progressLine(op); p != last {
			fmt.Fprintln(g.stderr, p)
			last = p
		}
		select {
		case <-cmd.Context().Done():
			return fmt.Errorf("wait for operation %s: %w", id, cmd.Context().Err())
		case <-tick.C:
		}
	}
}

func progressLine(op operationView) string {
	o := op.Operation
	done := o.Total - o.Pending
	return fmt.Sprintf("%s: %d/%d done (%d released, %d skipped, %d failed), %d pending",
		o.ID, done, o.Total, o.Released, o.Skipped, o.Failed, o.Pending)
}

func printOperationProgress(w io.Writer, op operationView) {
	o := op.Operation
	fmt.Fprintf(w, "Operation %s: %s, %d job(s) at %.4g/s: %d released, %d skipped, %d failed, %d pending.\n",
		o.ID, o.Status, o.Total, o.RatePerSecond, o.Released, o.Skipped, o.Failed, o.Pending)
	if len(op.Problems) > 0 {
		t := newTable(w, "JOB", "STATE", "ERROR")
		for _, p := range op.Problems {
			t.row(p.JobID, p.State, trunc(p.Error, 80))
		}
		_ = t.flush()
	}
}
