package main

import (
	"fmt"
	"strings"
	"time"

	"github.com/spf13/cobra"
)

// jobStatuses are the job statuses (jobstore.Status) that bulk retry
// filters on.
var jobStatuses = []string{"in_progress", "completed", "failed", "retrying", "held", "failed_max_retries", "cancelled"}

func newBulkRetryCmd(g *globals) *cobra.Command {
	var (
		statuses             []string
		jobType, errorClass  string
		since, until, reason string
		by                   string
		minRetries           int
		rate                 float64
		dryRun, reset, wait  bool
	)
	cmd := &cobra.Command{
		Use:   "bulk-retry",
		Short: "Retry many failed jobs at a bounded rate (try --dry-run first)",
		Long: `bulk-retry retries every job that matches the filter, at --rate jobs per
second, as a durable operation of the jobs API (it survives restarts).
Without --status it selects failed and failed_max_retries jobs.
--dry-run counts the matches and changes nothing.`,
		Example: `  retryd retries bulk-retry --job-type send_email --error-class rate_limit --dry-run
  retryd retries bulk-retry --job-type send_email --error-class rate_limit --rate 5 --wait`,
		Args: args(0),
		RunE: func(cmd *cobra.Command, _ []string) error {
			for _, s := range statuses {
				if !contains(jobStatuses, s) {
					return usageErrorf(cmd, "--status %q is not one of %s", s, strings.Join(jobStatuses, ", "))
				}
			}
			filter := map[string]any{}
			if len(statuses) > 0 {
				filter["status"] = statuses
			}
			if jobType != "" {
				filter["job_type"] = jobType
			}
			if errorClass != "" {
				filter["error_class"] = errorClass
			}
			if minRetries > 0 {
				filter["min_retry_count"] = minRetries
			}
			for name, v := range map[string]string{"since": since, "until": until} {
				if v == "" {
					continue
				}
				t, err := parseTimeFlag(v, time.Now())
				if err != nil {
					return usageErrorf(cmd, "--%s: %v", name, err)
				}
				filter[name] = t
			}
			if rate < 0 || rate > 1000 {
				return usageErrorf(cmd, "--rate must be above 0 and at most 1000 jobs per second, got %v", rate)
			}
			body := map[string]any{"filter": filter, "dry_run": dryRun}
			if rate > 0 {
				body["rate_per_second"] = rate
			}
			if reason != "" {
				body["reason"] = reason
			}
			if by != "" {
				body["by"] = by
			}
			if reset {
				body["reset_attempts"] = true
			}
			c, err := g.client()
			if err != nil {
				return err
			}
			if dryRun {
				var res struct {
					Matched int64 `json:"matched"`
				}
				raw, err := c.post(cmd.Context(), "/v1/jobs/bulk-retry", body, &res)
				if err != nil {
					return fmt.Errorf("bulk retry (dry run): %w", err)
				}
				if g.json {
					return printJSON(g.stdout, raw)
				}
				fmt.Fprintf(g.stdout, "Dry run: %d job(s) match; nothing was retried.\n", res.Matched)
				return nil
			}
			var op operationView
			raw, err := c.post(cmd.Context(), "/v1/jobs/bulk-retry", body, &op)
			if err != nil {
				return fmt.Errorf("bulk retry: %w", err)
			}
			if wait {
				if op, raw, err = waitOperation(cmd, g, c, op.Operation.ID); err != nil {
					return err
				}
			}
			if g.json {
				return printJSON(g.stdout, raw)
			}
			printOperation(g, op)
			return nil
		},
	}
	f := cmd.Flags()
	f.StringSliceVar(&statuses, "status", nil, "job statuses (repeat or comma-separate; default failed,failed_max_retries)")
	f.StringVar(&jobType, "job-type", "", "job type")
	f.StringVar(&errorClass, "error-class", "", "last error class, e.g. rate_limit")
	f.IntVar(&minRetries, "min-retry-count", 0, "jobs that used at least this many retries")
	f.StringVar(&since, "since", "", "jobs created at or after (RFC 3339, or a duration back from now such as 24h)")
	f.StringVar(&until, "until", "", "jobs created before (RFC 3339, or a duration back from now)")
	f.BoolVar(&dryRun, "dry-run", false, "count the matching jobs, change nothing")
	f.Float64Var(&rate, "rate", 0, "jobs released per second (default 10 on the server)")
	f.StringVar(&reason, "reason", "", "why (recorded on every retried job)")
	f.StringVar(&by, "by", "", "ignored: the API records the token's name")
	_ = f.MarkDeprecated("by", "the API records the token's name as by")
	f.BoolVar(&reset, "reset-attempts", false, "give every job its full retry budget again")
	f.BoolVar(&wait, "wait", false, "wait until the operation finished")
	return cmd
}

// parseTimeFlag reads an RFC 3339 time or a duration back from now.
func parseTimeFlag(v string, now time.Time) (time.Time, error) {
	if t, err := time.Parse(time.RFC3339Nano, v); err == nil {
		return t, nil
	}
	if d, err := time.ParseDuration(v); err == nil && d > 0 {
		return now.Add(-d).UTC(), nil
	}
	return time.Time{}, fmt.Errorf("%q is neither an RFC 3339 time nor a duration such as 24h", v)
}

func waitOperation(cmd *cobra.Command, g *globals, c *apiClient, id string) (operationView, []byte, error) {
	tick := time.NewTicker(250 * time.Millisecond)
	defer tick.Stop()
	for {
		var op operationView
		raw, err := c.get(cmd.Context(), "/v1/operations/"+seg(id), nil, &op)
		if err != nil {
			return op, nil, fmt.Errorf("wait for operation %s: %w", id, err)
		}
		if op.Operation.Status != "running" {
			return op, raw, nil
		}
		select {
		case <-cmd.Context().Done():
			return op, nil, fmt.Errorf("wait for operation %s: %w", id, cmd.Context().Err())
		case <-tick.C:
		}
	}
}

func printOperation(g *globals, op operationView) {
	o := op.Operation
	fmt.Fprintf(g.stdout, "Operation %s: %s, %d job(s) at %.4g/s: %d released, %d skipped, %d failed, %d pending.\n",
		o.ID, o.Status, o.Total, o.RatePerSecond, o.Released, o.Skipped, o.Failed, o.Pending)
	for _, p := range op.Problems {
		fmt.Fprintf(g.stdout, "  %s %s %s\n", p.JobID, p.State, p.Error)
	}
	if o.Status == "running" {
		fmt.Fprintf(g.stdout, "Follow it with: curl %s/v1/operations/%s\n", strings.TrimRight(g.api, "/"), o.ID)
	}
}
