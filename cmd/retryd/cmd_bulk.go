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

// bulkRetry is a bulk retry's flags. jobs bulk-retry names its jobs with
// --type and --status, both required; retries bulk-retry, its first
// spelling, kept for the scripts that use it, says --job-type and selects
// failed and failed_max_retries jobs without --status.
type bulkRetry struct {
	legacy                                    bool
	statuses                                  []string
	jobType, errorClass, since, until, reason string
	rate, by                                  string
	minRetries                                int
	dryRun, reset, wait                       bool
}

func newJobsBulkRetryCmd(g *globals) *cobra.Command { return (&bulkRetry{}).command(g) }

func newBulkRetryCmd(g *globals) *cobra.Command { return (&bulkRetry{legacy: true}).command(g) }

func (b *bulkRetry) command(g *globals) *cobra.Command {
	cmd := &cobra.Command{
		Use:   "bulk-retry",
		Short: "Retry the jobs of a type and status at a bounded rate (try --dry-run first)",
		Long: `bulk-retry retries every job of --type in --status (and the other
filters), at --rate jobs per second, as a durable operation of the jobs
API: it survives restarts. --dry-run counts the matches and changes
nothing; otherwise the operation's id is printed, and --wait follows its
progress until it finished (exit 1 if it ended cancelled or with failed
jobs).`,
		Example: `  retryd jobs bulk-retry --type send_email --status failed_max_retries --error-class rate_limit --dry-run
  retryd jobs bulk-retry --type send_email --status failed_max_retries --rate 5/s --reason "quota raised" --wait`,
		Args: args(0),
		RunE: func(cmd *cobra.Command, _ []string) error { return b.run(cmd, g) },
	}
	typeFlag := "type"
	if b.legacy {
		typeFlag = "job-type"
		cmd.Short = "Retry many failed jobs at a bounded rate (jobs bulk-retry's first spelling)"
		cmd.Long = `bulk-retry is jobs bulk-retry with its first flags: --job-type for
--type, and without --status it selects failed and failed_max_retries
jobs. See retryd jobs bulk-retry --help.`
		cmd.Example = `  retryd retries bulk-retry --job-type send_email --error-class rate_limit --dry-run
  retryd retries bulk-retry --job-type send_email --error-class rate_limit --rate 5 --wait`
	}
	f := cmd.Flags()
	f.StringVar(&b.jobType, typeFlag, "", "job type (required)")
	f.StringSliceVar(&b.statuses, "status", nil, "job statuses (required; repeat or comma-separate): "+strings.Join(jobStatuses, ", "))
	if b.legacy {
		f.Lookup(typeFlag).Usage = "job type"
		f.Lookup("status").Usage = "job statuses (repeat or comma-separate; default failed,failed_max_retries)"
		f.StringVar(&b.by, "by", "", "ignored: the API records the token's name")
		_ = f.MarkDeprecated("by", "the API records the token's name as by")
	}
	f.StringVar(&b.errorClass, "error-class", "", "class of the last error, e.g. rate_limit")
	f.IntVar(&b.minRetries, "min-retry-count", 0, "jobs that used at least this many retries")
	f.StringVar(&b.since, "since", "", "changed at or after (RFC 3339, or a duration back from now such as 24h)")
	f.StringVar(&b.until, "until", "", "changed before (RFC 3339, or a duration back from now)")
	f.BoolVar(&b.dryRun, "dry-run", false, "count the jobs that would be retried, change nothing")
	f.StringVar(&b.rate, "rate", "", "jobs released per second, 5 or 5/s (the server's default is 10, at most 1000)")
	f.StringVar(&b.reason, "reason", "", "why (recorded on every retried job)")
	f.BoolVar(&b.reset, "reset-attempts", false, "give every job its whole retry budget again")
	f.BoolVar(&b.wait, "wait", false, "follow the operation's progress until it finished")
	return cmd
}

// body checks the flags and builds the request; a usage error names the
// flag.
func (b *bulkRetry) body(cmd *cobra.Command) (map[string]any, error) {
	if !b.legacy {
		// Both are required: a bulk action names what it acts on
		// rather than falling back to every failed job.
		if b.jobType == "" {
			return nil, usageErrorf(cmd, "--type is required: the job type to retry")
		}
		if len(b.statuses) == 0 {
			return nil, usageErrorf(cmd, "--status is required: one or more of %s", strings.Join(jobStatuses, ", "))
		}
	}
	if err := checkStatuses(cmd, b.statuses, jobStatuses); err != nil {
		return nil, err
	}
	if b.minRetries < 0 {
		return nil, usageErrorf(cmd, "--min-retry-count must not be negative, got %d", b.minRetries)
	}
	if b.dryRun && b.wait {
		return nil, usageErrorf(cmd, "--wait has nothing to wait for with --dry-run")
	}
	filter := map[string]any{}
	if len(b.statuses) > 0 {
		filter["status"] = b.statuses
	}
	for name, v := range map[string]string{"job_type": b.jobType, "error_class": b.errorClass} {
		if v != "" {
			filter[name] = v
		}
	}
	if b.minRetries > 0 {
		filter["min_retry_count"] = b.minRetries
	}
	if err := timeFlags(cmd, b.since, b.until, func(name string, t time.Time) { filter[name] = t }); err != nil {
		return nil, err
	}
	body := map[string]any{"filter": filter, "dry_run": b.dryRun}
	if b.rate != "" {
		n, err := parseRate(b.rate)
		if err != nil {
			return nil, usageErrorf(cmd, "%v", err)
		}
		body["rate_per_second"] = n
	}
	if b.reason != "" {
		body["reason"] = b.reason
	}
	if b.reset {
		body["reset_attempts"] = true
	}
	return body, nil
}

func (b *bulkRetry) run(cmd *cobra.Command, g *globals) error {
	body, err := b.body(cmd)
	if err != nil {
		return err
	}
	what := "jobs"
	if b.jobType != "" {
		what = b.jobType + " jobs"
	}
	c, err := g.client()
	if err != nil {
		return err
	}
	if b.dryRun {
		var res dryRunView
		raw, err := c.post(cmd.Context(), "/v1/jobs/bulk-retry", body, &res)
		if err != nil {
			return fmt.Errorf("bulk retry %s (dry run): %w", what, err)
		}
		if g.json {
			return printJSON(g.stdout, raw)
		}
		fmt.Fprintf(g.stdout, "Dry run: %d job(s) would be retried; nothing was changed.\n", res.Matched)
		return nil
	}
	var op operationView
	raw, err := c.post(cmd.Context(), "/v1/jobs/bulk-retry", body, &op)
	if err != nil {
		return fmt.Errorf("bulk retry %s: %w", what, err)
	}
	o := op.Operation
	if !g.json {
		fmt.Fprintf(g.stdout, "Started bulk retry %s: %d job(s) at %.4g/s.\n", o.ID, o.Total, o.RatePerSecond)
	}
	if !b.wait {
		if g.json {
			return printJSON(g.stdout, raw)
		}
		fmt.Fprintf(g.stdout, "Follow it with: retryd jobs operation %s --wait\n", o.ID)
		return nil
	}
	return followOperation(cmd, g, c, o.ID)
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
