package main

import (
	"context"
	"encoding/json"
	"fmt"
	"testing"
	"time"

	"github.com/stretchr/testify/require"

	"github.com/retryd/retryd/pkg/contract"
	"github.com/retryd/retryd/pkg/errclass"
	"github.com/retryd/retryd/pkg/worker"
)

func TestAnalyticsAndBulkRetry(t *testing.T) {
	t.Parallel()
	// cli_flaky fails its first attempt with a timeout and then works;
	// cli_broken always fails with a validation error (not retried).
	b := setup(t, map[string]worker.Handler{
		"cli_flaky": func(_ context.Context, j *worker.Job) error {
			if j.Attempt == 1 {
				return errclass.New(errclass.Timeout, "upstream timed out after 3000ms")
			}
			return nil
		},
		"cli_broken": func(context.Context, *worker.Job) error {
			return errclass.New(errclass.Validation, "payload field email is missing")
		},
	})
	b.ok(t, "policies", "set", "job", "cli_flaky", "--max-retries", "3", "--base-delay", "10ms", "--max-delay", "50ms", "--jitter", "none")

	flaky := []string{contract.NewID(), contract.NewID()}
	broken := []string{contract.NewID(), contract.NewID(), contract.NewID()}
	for _, id := range flaky {
		_, err := worker.Enqueue(b.ctx, b.stack.JS, contract.JobData{ID: id, JobType: "cli_flaky"})
		require.NoError(t, err)
	}
	for _, id := range broken {
		_, err := worker.Enqueue(b.ctx, b.stack.JS, contract.JobData{ID: id, JobType: "cli_broken"})
		require.NoError(t, err)
	}
	for _, id := range flaky {
		b.waitRetry(t, "job", id, "succeeded")
	}
	for _, id := range broken {
		b.waitRetry(t, "job", id, "exhausted")
	}

	// The jobs projection folds the streams into the analytics.
	var a analyticsView
	require.Eventually(t, func() bool {
		a = analyticsView{}
		r := b.cli(t, "analytics", "--json")
		if r.code != exitOK || json.Unmarshal([]byte(r.stdout), &a) != nil {
			return false
		}
		byType := map[string]typeAnalytics{}
		for _, ta := range a.JobTypes {
			byType[ta.JobType] = ta
		}
		return byType["cli_flaky"].Succeeded == 2 && byType["cli_broken"].Failed == 3
	}, wait, 50*time.Millisecond, "analytics never showed the jobs: %+v", a)

	out := b.ok(t, "analytics")
	// Every kind first, from the scheduler's rows: both types are jobs.
	require.Regexp(t, `(?m)^job\s+5\s+2\s+3\s+40.0%\s+2\s+2\s+succeeded 2, exhausted 3\s+validation 3, timeout 2`, out)
	require.Regexp(t, `cli_broken\s+3\s+0\s+3\s+0.0%`, out)
	require.Regexp(t, `cli_flaky\s+2\s+2\s+0\s+100.0%\s+2.00\s+2\s+2\s+100.0%`, out)
	require.Regexp(t, `cli_broken\s+validation\s+3`, out)
	require.Regexp(t, `cli_flaky\s+timeout\s+2`, out)
	require.Regexp(t, `cli_broken\s+validation\s+3\s+payload field email is missing`, out)
	require.Regexp(t, `cli_flaky\s+completed 2\s+1: 2`, out)

	out = b.ok(t, "analytics", "--kind", "event")
	require.Contains(t, out, "Nothing was retried in this period.", "no events here")
	require.Contains(t, out, "No jobs in this period.", "kind event has no job types")
	var k analyticsView
	b.okJSON(t, &k, "analytics", "--kind", "job")
	require.Len(t, k.Kinds, 1)
	require.EqualValues(t, 5, k.Kinds[0].Items)

	out = b.ok(t, "analytics", "--job-type", "cli_flaky", "--since", "1h")
	require.Contains(t, out, "cli_flaky")
	require.NotContains(t, out, "cli_broken")

	t.Run("bulk-retry", func(t *testing.T) {
		out := b.ok(t, "retries", "bulk-retry", "--job-type", "cli_broken", "--error-class", "validation", "--dry-run")
		require.Equal(t, "Dry run: 3 job(s) would be retried; nothing was changed.\n", out)
		var dry struct {
			DryRun  bool  `json:"dry_run"`
			Matched int64 `json:"matched"`
		}
		b.okJSON(t, &dry, "retries", "bulk-retry", "--job-type", "cli_flaky", "--status", "completed", "--dry-run")
		require.True(t, dry.DryRun)
		require.EqualValues(t, 2, dry.Matched)

		out = b.ok(t, "retries", "bulk-retry", "--job-type", "cli_broken", "--rate", "50", "--reason", "fixed the payloads", "--wait")
		require.Regexp(t, `Operation op-\S+: completed, 3 job\(s\) at 50/s: 3 released, 0 skipped, 0 failed, 0 pending.`, out)
		for _, id := range broken {
			var v retryView
			b.okJSON(t, &v, "retries", "show", "job", id)
			require.Contains(t, events(v.History), "rescheduled", "job %s was retried", id)
		}
	})

	r := b.cli(t, "analytics", "--days", "2", "--since", "1h")
	require.Equal(t, exitUsage, r.code)
	r = b.cli(t, "analytics", "--days", "0")
	require.Equal(t, exitFailed, r.code, "the API refuses it")
	require.Contains(t, r.stderr, fmt.Sprintf("HTTP %d", 400))
}
