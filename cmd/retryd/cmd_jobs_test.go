package main

import (
	"encoding/json"
	"regexp"
	"strings"
	"testing"
	"time"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/retryd/retryd/pkg/contract"
)

// waitJob polls `jobs show` until the job's row passes ok: the jobs table
// follows the streams a moment after the scheduler.
func (b *bundle) waitJob(t *testing.T, id string, ok func(jobView) bool) jobView {
	t.Helper()
	var v jobView
	var last result
	if !assert.Eventually(t, func() bool {
		last = b.cli(t, "jobs", "show", id, "--json")
		if last.code != exitOK {
			return false
		}
		v = jobView{}
		return json.Unmarshal([]byte(last.stdout), &v) == nil && v.Job != nil && ok(v)
	}, wait, 20*time.Millisecond, "job %s never got there", id) {
		t.Fatalf("last answer: %s %s", last.stdout, last.stderr)
	}
	return v
}

func jobStatus(status string) func(jobView) bool {
	return func(v jobView) bool { return string(v.Job.Status) == status }
}

func TestJobsCommands(t *testing.T) {
	t.Parallel()
	b := setup(t, nil)
	// A slow policy keeps the jobs retrying while the test looks.
	b.ok(t, "policies", "set", "job", "cli_jobs", "--max-retries", "3", "--base-delay", "1h", "--max-delay", "2h", "--jitter", "none")

	a, c := contract.NewID(), contract.NewID()
	b.fail(t, a, "cli_jobs", 1, "timeout", "upstream timed out after 30s")
	// c's worker names its priority band.
	b.failed(t, contract.FailedData{Kind: contract.KindJob, ID: c, Attempt: 1, JobType: "cli_jobs", Priority: contract.PriorityHigh,
		Error: contract.ErrorInfo{Class: "rate_limit", Message: "429 too many requests"}})
	// Two jobs without retries: failed_max_retries at once, for bulk retry.
	dead := []string{contract.NewID(), contract.NewID()}
	for _, id := range dead {
		b.failed(t, contract.FailedData{
			Kind: contract.KindJob, ID: id, Attempt: 1, JobType: "cli_jobs_dead", MaxRetries: new(0),
			Error: contract.ErrorInfo{Class: "timeout", Message: "upstream timed out"},
		})
	}
	b.waitJob(t, a, jobStatus("retrying"))
	b.waitJob(t, c, jobStatus("retrying"))
	for _, id := range dead {
		b.waitJob(t, id, jobStatus("failed_max_retries"))
	}

	t.Run("list", func(t *testing.T) {
		out := b.ok(t, "jobs", "list", "--type", "cli_jobs")
		lines := strings.Split(strings.TrimSpace(out), "\n")
		require.Len(t, lines, 3, out)
		require.Regexp(t, `^ID\s+TYPE\s+STATUS\s+PRIORITY\s+ATTEMPT\s+RETRIES\s+LAST ERROR CLASS\s+NEXT RETRY\s+UPDATED$`, lines[0])
		require.Regexp(t, a+`\s+cli_jobs\s+retrying\s+normal\s+2\s+1/3\s+timeout\s+in (1h|59m)\S*\s+\S+ ago`, out)
		require.Regexp(t, c+`\s+cli_jobs\s+retrying\s+high\s+2\s+1/3\s+rate_limit\s+in (1h|59m)`, out)

		// The priority band filters too.
		out = b.ok(t, "jobs", "list", "--type", "cli_jobs", "--priority", "HIGH")
		require.Contains(t, out, c)
		require.NotContains(t, out, a)
		pr := b.cli(t, "jobs", "list", "--priority", "urgent")
		require.Equal(t, exitUsage, pr.code, pr.stderr)
		require.Contains(t, pr.stderr, "--priority")

		// Filters: status and the last error's class.
		out = b.ok(t, "jobs", "list", "--type", "cli_jobs", "--status", "retrying,held", "--error-class", "timeout")
		require.Contains(t, out, a)
		require.NotContains(t, out, c)
		out = b.ok(t, "jobs", "list", "--status", "failed_max_retries")
		require.Contains(t, out, dead[0])
		require.Contains(t, out, dead[1])
		require.NotContains(t, out, a)
		require.Equal(t, "No jobs match.\n", b.ok(t, "jobs", "list", "--type", "cli_none"))

		var page jobPage
		b.okJSON(t, &page, "jobs", "list", "--type", "cli_jobs")
		require.Len(t, page.Jobs, 2)
		require.Equal(t, 3, *page.Jobs[0].MaxRetries)

		// Paging: one per page, the cursor is offered on stderr; --all follows it.
		r := b.cli(t, "jobs", "list", "--type", "cli_jobs", "--limit", "1")
		require.Equal(t, exitOK, r.code, r.stderr)
		cur := regexp.MustCompile(`--cursor (\S+)`).FindStringSubmatch(r.stderr)
		require.NotNil(t, cur, r.stderr)
		page = jobPage{}
		b.okJSON(t, &page, "jobs", "list", "--type", "cli_jobs", "--limit", "1", "--cursor", cur[1])
		require.Len(t, page.Jobs, 1)
		require.NotContains(t, r.stdout, page.Jobs[0].ID, "the second page goes on after the first")
		page = jobPage{}
		b.okJSON(t, &page, "jobs", "list", "--type", "cli_jobs", "--limit", "1", "--all")
		require.Len(t, page.Jobs, 2)
	})

	t.Run("show", func(t *testing.T) {
		out := b.ok(t, "jobs", "show", a)
		require.Regexp(t, `Status:\s+retrying`, out)
		require.Regexp(t, `Type:\s+cli_jobs`, out)
		require.Regexp(t, `Retries used:\s+1 of 3`, out)
		require.Regexp(t, `Last error:\s+timeout: upstream timed out after 30s`, out)
		require.Regexp(t, `Next retry:\s+\S+ \(in (1h|59m)`, out)
		require.Contains(t, out, "Attempts (2 events):")
		require.Regexp(t, `TIME\s+EVENT\s+ATTEMPT\s+EXECUTOR\s+CLASS\s+MESSAGE\s+DELAY\s+DECIDED BY`, out)
		require.Regexp(t, `failed\s+1\s+\S+\s+timeout\s+upstream timed out after 30s\s+-\s+-`, out)
		require.Regexp(t, `scheduled\s+2\s+-\s+timeout\s+base 1h; retry 1 of 3\s+1h\s+backoff`, out)

		var v jobView
		b.okJSON(t, &v, "jobs", "show", a)
		require.Equal(t, a, v.Job.ID)
		require.Equal(t, []string{"failed", "scheduled"}, events(v.History))
	})

	t.Run("retry", func(t *testing.T) {
		out := b.ok(t, "jobs", "retry", c, "--reason", "limit lifted")
		require.Equal(t, "Retry of job "+c+" accepted: a new attempt is scheduled now (by local).\n"+
			"Its status follows in a moment: retryd jobs show "+c+"\n", out)
		// The row follows the manual retry: a new attempt, 3.
		v := b.waitJob(t, c, func(v jobView) bool { return v.Job.Attempt == 3 })
		var manual *historyEntry
		for i, h := range v.History {
			if h.Event == "rescheduled" {
				manual = &v.History[i]
			}
		}
		require.NotNil(t, manual, "history: %v", events(v.History))
		require.Equal(t, "manual", manual.DecidedBy)
		require.Regexp(t, `rescheduled\s+3\s+-\s+rate_limit\s+.*limit lifted.*manual`, b.ok(t, "jobs", "show", c))

		var res jobActionView
		b.okJSON(t, &res, "jobs", "retry", c, "--reset-attempts")
		require.Equal(t, jobActionView{ID: c, Action: "retry", By: "local"}, res)
		b.waitJob(t, c, func(v jobView) bool { return v.Job.RetryCount == 0 })
	})

	t.Run("cancel", func(t *testing.T) {
		out := b.ok(t, "jobs", "cancel", a, "--reason", "customer deleted")
		require.Contains(t, out, "Cancelled job "+a+"'s pending retry")
		v := b.waitJob(t, a, jobStatus("cancelled"))
		require.Equal(t, "cancelled", v.History[len(v.History)-1].Event)
		require.Contains(t, b.ok(t, "jobs", "show", a), "customer deleted")

		// A finished job has nothing to cancel: the API says 409.
		r := b.cli(t, "jobs", "cancel", a)
		require.Equal(t, exitFailed, r.code)
		require.Contains(t, r.stderr, "Error: cancel job: ")
		require.Contains(t, r.stderr, a)
		require.Contains(t, r.stderr, "HTTP 409")
	})

	t.Run("bulk-retry", func(t *testing.T) {
		out := b.ok(t, "jobs", "bulk-retry", "--type", "cli_jobs_dead", "--status", "failed_max_retries", "--error-class", "timeout", "--dry-run")
		require.Equal(t, "Dry run: 2 job(s) would be retried; nothing was changed.\n", out)
		var dry struct {
			DryRun  bool  `json:"dry_run"`
			Matched int64 `json:"matched"`
		}
		b.okJSON(t, &dry, "jobs", "bulk-retry", "--type", "cli_jobs_dead", "--status", "failed_max_retries", "--error-class", "network", "--dry-run")
		require.True(t, dry.DryRun)
		require.EqualValues(t, 0, dry.Matched)

		r := b.cli(t, "jobs", "bulk-retry", "--type", "cli_jobs_dead", "--status", "failed_max_retries", "--rate", "4/s", "--reason", "upstream back", "--wait")
		require.Equal(t, exitOK, r.code, r.stderr)
		m := regexp.MustCompile(`^Started bulk retry (op-\S+): 2 job\(s\) at 4/s\.\n`).FindStringSubmatch(r.stdout)
		require.NotNil(t, m, r.stdout)
		op := m[1]
		require.Contains(t, r.stdout, "Operation "+op+": completed, 2 job(s) at 4/s: 2 released, 0 skipped, 0 failed, 0 pending.\n")
		// At 4 per second the second job waits a tick: progress shows.
		require.Contains(t, r.stderr, op+": ")
		require.Regexp(t, `\d/2 done \(\d released, 0 skipped, 0 failed\), \d pending`, r.stderr)
		for _, id := range dead {
			v := b.waitJob(t, id, func(v jobView) bool { return v.Job.Attempt == 2 })
			require.Contains(t, events(v.History), "rescheduled", "job %s was retried", id)
		}

		require.Contains(t, b.ok(t, "jobs", "operation", op), "Operation "+op+": completed")
		var ov operationView
		b.okJSON(t, &ov, "jobs", "op", op, "--wait")
		require.Equal(t, "completed", ov.Operation.Status)
		require.Equal(t, 2, ov.Operation.Released)

		// A slow one, stopped: following it then fails (exit 1).
		out = b.ok(t, "jobs", "bulk-retry", "--type", "cli_jobs_dead", "--status", "in_progress,retrying,held", "--rate", "0.01")
		m = regexp.MustCompile(`^Started bulk retry (op-\S+): 2 job\(s\) at 0.01/s\.\n`).FindStringSubmatch(out)
		require.NotNil(t, m, out)
		require.Contains(t, b.ok(t, "jobs", "operation", m[1], "--cancel"), "Operation "+m[1]+": cancelled")
		r = b.cli(t, "jobs", "operation", m[1], "--wait")
		require.Equal(t, exitFailed, r.code, r.stdout)
		require.Contains(t, r.stdout, "Operation "+m[1]+": cancelled")
		require.Contains(t, r.stderr, "Error: bulk retry "+m[1]+": cancelled")

		// The list: newest first, by status.
		out = b.ok(t, "jobs", "operations")
		require.Regexp(t, `(?s)^ID\s+STATUS.*`+m[1]+`\s+cancelled.*`+op+`\s+completed\s.*upstream back`, out)
		out = b.ok(t, "jobs", "operations", "--status", "cancelled")
		require.Contains(t, out, m[1])
		require.NotContains(t, out, op)
		var ops operationPage
		b.okJSON(t, &ops, "jobs", "operations", "--limit", "1")
		require.Len(t, ops.Operations, 1)
		require.Equal(t, m[1], ops.Operations[0].ID)
		require.NotEmpty(t, ops.NextCursor)

		// Without --wait: the id to follow.
		out = b.ok(t, "jobs", "bulk-retry", "--type", "cli_jobs", "--status", "cancelled")
		require.Regexp(t, `^Started bulk retry op-\S+: 1 job\(s\) at 10/s\.\nFollow it with: retryd jobs operation op-\S+ --wait\n$`, out)
	})

	t.Run("errors", func(t *testing.T) {
		unknown := contract.NewID()
		r := b.cli(t, "jobs", "show", unknown)
		require.Equal(t, exitFailed, r.code)
		require.Contains(t, r.stderr, "Error: show job: job "+unknown)
		require.Contains(t, r.stderr, "HTTP 404 not_found")

		r = b.cli(t, "jobs", "retry", unknown)
		require.Equal(t, exitFailed, r.code)
		require.Contains(t, r.stderr, unknown)
		require.Contains(t, r.stderr, "HTTP 404")

		r = b.cli(t, "jobs", "operation", "op-nosuch")
		require.Equal(t, exitFailed, r.code)
		require.Contains(t, r.stderr, "op-nosuch")
		require.Contains(t, r.stderr, "HTTP 404")

		r = b.cli(t, "jobs", "list", "--type", "Bad.Type")
		require.Equal(t, exitFailed, r.code, "the API refuses it")
		require.Contains(t, r.stderr, "list jobs: ")
		require.Contains(t, r.stderr, "HTTP 400")
	})
}

func TestJobsUsage(t *testing.T) {
	t.Parallel()
	requireUsage(t, []usageCase{
		{[]string{"jobs", "lst"}, "did you mean list?"},
		{[]string{"jobs", "list", "--status", "bogus"}, `--status "bogus" is not one of`},
		{[]string{"jobs", "list", "--limit", "0"}, "--limit must be between 1 and 1000"},
		{[]string{"jobs", "list", "--cursor", "abc", "--all"}, "--cursor and --all"},
		{[]string{"jobs", "list", "--since", "yesterday"}, "--since"},
		{[]string{"jobs", "list", "--min-retry-count", "-1"}, "--min-retry-count"},
		{[]string{"jobs", "list", "--bogus"}, "unknown flag: --bogus"},
		{[]string{"jobs", "show"}, "takes ID"},
		{[]string{"jobs", "show", "a", "b"}, "takes ID"},
		{[]string{"jobs", "cancel", "x", "--reset-attempts"}, "unknown flag: --reset-attempts"},
		{[]string{"jobs", "bulk-retry", "--status", "failed"}, "--type is required"},
		{[]string{"jobs", "bulk-retry", "--type", "t"}, "--status is required"},
		{[]string{"jobs", "bulk-retry", "--type", "t", "--status", "nope"}, `--status "nope"`},
		{[]string{"jobs", "bulk-retry", "--type", "t", "--status", "failed", "--rate", "0"}, `--rate "0"`},
		{[]string{"jobs", "bulk-retry", "--type", "t", "--status", "failed", "--rate", "fast"}, `--rate "fast"`},
		{[]string{"jobs", "bulk-retry", "--type", "t", "--status", "failed", "--rate", "2000/s"}, `--rate "2000/s"`},
		{[]string{"jobs", "bulk-retry", "--type", "t", "--status", "failed", "--dry-run", "--wait"}, "--wait"},
		{[]string{"jobs", "operation"}, "takes ID"},
		{[]string{"jobs", "operation", "op-1", "--wait", "--cancel"}, "--wait and --cancel"},
		{[]string{"jobs", "operations", "--status", "done"}, `--status "done" is not one of running, completed, cancelled`},
		{[]string{"jobs", "operations", "--limit", "0"}, "--limit must be between 1 and 1000"},
		{[]string{"jobs", "operations", "op-1"}, "to show one: retryd jobs operation op-1"},
	})
}
