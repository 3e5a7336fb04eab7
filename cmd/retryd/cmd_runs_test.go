package main

import (
	"strings"
	"testing"
	"time"

	"github.com/stretchr/testify/require"

	"github.com/retryd/retryd/pkg/contract"
)

// insertRun writes a workflow run straight into workflow_runs, as the
// triggers service would have.
func (b *bundle) insertRun(t *testing.T, id, workflow, status string, requestedAt time.Time, set string, args ...any) {
	t.Helper()
	_, err := b.stack.Pool.Exec(b.ctx, `INSERT INTO workflow_runs (run_id, workflow, trigger_id, delivery_id, event_id, status, requested_at)
		VALUES ($1::text, $2, 'trg-1', 'd-' || $1::text, 'e-' || $1::text, $3, $4)`, id, workflow, status, requestedAt)
	require.NoError(t, err)
	if set != "" {
		_, err = b.stack.Pool.Exec(b.ctx, `UPDATE workflow_runs SET `+set+` WHERE run_id = $1`, append([]any{id}, args...)...)
		require.NoError(t, err)
	}
}

// insertRunStep writes a step of a run; order orders the steps as their
// first reports would (reported_at).
func (b *bundle) insertRunStep(t *testing.T, runID, node string, order int, status string, attempts int, retryState, class, msg, executor, output string) {
	t.Helper()
	var out any
	if output != "" {
		out = output
	}
	_, err := b.stack.Pool.Exec(b.ctx, `INSERT INTO workflow_run_steps (run_id, step_id, reported_at, status, attempts, run_attempt,
			retry_state, last_error_class, last_error_message, executor, output)
		VALUES ($1, $2, now() - interval '1 hour' + $3::int * interval '1 second', $4, $5::int, $5::int, $6, $7, $8, $9, $10::jsonb)`,
		runID, node, order, status, attempts, retryState, class, msg, executor, out)
	require.NoError(t, err)
}

func TestRunsCommands(t *testing.T) {
	t.Parallel()
	b := setup(t, nil)
	now := time.Now().UTC()
	retrying, done, fresh := "run-cli-retrying", "run-cli-done", "run-cli-fresh"
	b.insertRun(t, done, "onboard", "completed", now.Add(-3*time.Minute), "finished_at = now()")
	b.insertRun(t, retrying, "onboard", "retrying", now.Add(-2*time.Minute),
		`attempt = 2, retry_count = 1, max_retries = 3, current_node_id = 'enrich', last_error_class = 'timeout',
		 last_error_message = 'crm timed out', last_error_timestamp = now(), next_retry_at = now() + interval '1 hour', executor = 'engine-7'`)
	b.insertRun(t, fresh, "billing", "in_progress", now.Add(-time.Minute), "current_node_id = 'charge'")
	b.insertRunStep(t, retrying, "fetch", 0, "completed", 2, "none", "", "", "engine-7", `{"rows":3}`)
	b.insertRunStep(t, retrying, "enrich", 1, "failed", 2, "scheduled", "timeout", "crm timed out", "engine-7", "")

	t.Run("list", func(t *testing.T) {
		out := b.ok(t, "runs", "list")
		lines := strings.Split(strings.TrimSpace(out), "\n")
		require.Len(t, lines, 4, out)
		require.Regexp(t, `^ID\s+WORKFLOW\s+STATUS\s+ATTEMPT\s+RETRIES\s+NODE\s+LAST ERROR CLASS\s+NEXT RETRY\s+REQUESTED`, lines[0])
		require.True(t, strings.HasPrefix(lines[1], fresh), "newest first: %s", out)
		require.Regexp(t, retrying+`\s+onboard\s+retrying\s+2\s+1/3\s+enrich\s+timeout\s+in (1h|59m)`, out)

		var page runPage
		b.okJSON(t, &page, "runs", "list", "--status", "retrying,failed")
		require.Len(t, page.Runs, 1)
		require.Equal(t, retrying, page.Runs[0].ID)
		b.okJSON(t, &page, "runs", "list", "--workflow", "onboard")
		require.Len(t, page.Runs, 2)
		b.okJSON(t, &page, "runs", "list", "--error-class", "timeout", "--trigger", "trg-1")
		require.Len(t, page.Runs, 1)

		r := b.cli(t, "runs", "list", "--limit", "1")
		require.Equal(t, exitOK, r.code)
		require.Contains(t, r.stderr, "--cursor")
		b.okJSON(t, &page, "runs", "list", "--limit", "1", "--all")
		require.Len(t, page.Runs, 3)

		require.Equal(t, "No runs match.\n", b.ok(t, "runs", "list", "--status", "permanently_failed"))
	})

	t.Run("show", func(t *testing.T) {
		out := b.ok(t, "runs", "show", retrying)
		require.Regexp(t, `Status:\s+retrying`, out)
		require.Regexp(t, `Attempt:\s+2`, out)
		require.Regexp(t, `Retries used:\s+1 of 3`, out)
		require.Regexp(t, `Next retry:\s+\S+ \(in (1h|59m)`, out)
		require.Regexp(t, `Current node:\s+enrich`, out)
		require.Regexp(t, `Last error:\s+timeout: crm timed out`, out)
		require.Regexp(t, `Executor:\s+engine-7`, out)
		require.Contains(t, out, "Steps (2):")
		require.Regexp(t, `NODE\s+STATUS\s+ATTEMPTS\s+RUN ATTEMPT\s+RETRY STATE\s+EXECUTOR\s+ERROR\s+OUTPUT`, out)
		require.Regexp(t, `fetch\s+completed\s+2\s+2\s+none\s+engine-7\s+-\s+\{"rows": ?3\}`, out)
		require.Regexp(t, `enrich\s+failed\s+2\s+2\s+scheduled\s+engine-7\s+timeout: crm timed out`, out)

		var v runView
		b.okJSON(t, &v, "runs", "show", retrying)
		require.Equal(t, retrying, v.Run.ID)
		require.Len(t, v.Steps, 2)
		require.Equal(t, "enrich", v.Steps[1].Node)

		require.Contains(t, out, "Why it retried: retryd retries show run "+retrying)
		out = b.ok(t, "runs", "show", fresh)
		require.Contains(t, out, "(no step reported yet)")
		require.NotContains(t, out, "Why it retried")
		r := b.cli(t, "runs", "show", "run-nope")
		require.Equal(t, exitFailed, r.code)
		require.Contains(t, r.stderr, "run run-nope")
		require.Contains(t, r.stderr, "not found")
	})

	t.Run("retry", func(t *testing.T) {
		// A run that never failed has no retry at the scheduler.
		r := b.cli(t, "runs", "retry", fresh)
		require.Equal(t, exitFailed, r.code)
		require.Contains(t, r.stderr, "retry run "+fresh+": it is in_progress and has no retry at the scheduler")
		r = b.cli(t, "runs", "retry", "run-nope")
		require.Equal(t, exitFailed, r.code)
		require.Contains(t, r.stderr, "retry run run-nope: no such run")

		// The failure of the retrying run, as the triggers service reports
		// it: the scheduler has its retry; retry it now by hand.
		b.failed(t, contract.FailedData{Kind: contract.KindRun, ID: retrying, Attempt: 1,
			Error: contract.ErrorInfo{Class: "timeout", Message: "crm timed out"}})
		b.waitRetry(t, contract.KindRun, retrying, "scheduled")
		out := b.ok(t, "runs", "retry", retrying, "--reason", "crm back up")
		require.Contains(t, out, "Retry of run "+retrying+" accepted: attempt 3 is scheduled now")
		v := b.waitRetry(t, contract.KindRun, retrying, "due")
		require.Equal(t, 3, v.Retry.Attempt)
		last := v.History[len(v.History)-1]
		require.Contains(t, []string{"rescheduled", "due"}, last.Event)
	})
}

func TestRunsUsage(t *testing.T) {
	t.Parallel()
	requireUsage(t, []usageCase{
		{[]string{"runs", "lst"}, "did you mean list?"},
		{[]string{"runs", "list", "--status", "running"}, `--status "running" is not one of requested, in_progress, retrying`},
		{[]string{"runs", "list", "--limit", "0"}, "--limit must be between 1 and 500"},
		{[]string{"runs", "list", "--limit", "501"}, "--limit must be between 1 and 500"},
		{[]string{"runs", "list", "--cursor", "abc", "--all"}, "--cursor and --all"},
		{[]string{"runs", "show"}, "takes ID"},
		{[]string{"runs", "retry"}, "takes ID"},
		{[]string{"runs", "retry", "a", "b"}, "takes ID"},
	})
}
