package main

import (
	"strings"
	"testing"
	"time"

	"github.com/stretchr/testify/require"

	"github.com/retryd/retryd/pkg/contract"
)

func TestRetriesCommands(t *testing.T) {
	t.Parallel()
	b := setup(t, nil)
	// A slow policy keeps the retries scheduled while the test looks.
	out := b.ok(t, "policies", "set", "job", "cli_slow", "--max-retries", "3", "--base-delay", "1h", "--max-delay", "2h", "--jitter", "none")
	require.Contains(t, out, "Policy job/cli_slow is now version 1.")

	a, c := contract.NewID(), contract.NewID()
	b.fail(t, a, "cli_slow", 1, "timeout", "upstream timed out after 30s")
	b.fail(t, c, "cli_slow", 1, "rate_limit", "429 too many requests")
	b.waitRetry(t, "job", a, "scheduled")
	b.waitRetry(t, "job", c, "scheduled")

	t.Run("list", func(t *testing.T) {
		out := b.ok(t, "retries", "list", "--kind", "job", "--job-type", "cli_slow", "--state", "scheduled")
		lines := strings.Split(strings.TrimSpace(out), "\n")
		require.Len(t, lines, 3, out)
		require.Regexp(t, `^KIND\s+ID\s+STATE\s+ATTEMPT\s+RETRIES\s+NEXT ATTEMPT`, lines[0])
		require.Contains(t, out, a)
		require.Contains(t, out, c)
		require.Regexp(t, `job\s+`+a+`\s+scheduled\s+2\s+1/3\s+in (1h|59m)`, out)
		require.Contains(t, out, "timeout: upstream timed out after 30s")

		var page retryPage
		b.okJSON(t, &page, "retries", "list", "--job-type", "cli_slow")
		require.Len(t, page.Retries, 2)

		// Paging: one per page, the cursor is offered on stderr; --all follows it.
		r := b.cli(t, "retries", "list", "--job-type", "cli_slow", "--limit", "1")
		require.Equal(t, exitOK, r.code)
		require.Contains(t, r.stderr, "--cursor")
		b.okJSON(t, &page, "retries", "list", "--job-type", "cli_slow", "--limit", "1", "--all")
		require.Len(t, page.Retries, 2)

		require.Equal(t, "No retries match.\n", b.ok(t, "retries", "list", "--job-type", "cli_none"))
	})

	t.Run("show", func(t *testing.T) {
		out := b.ok(t, "retries", "show", "job", a)
		require.Regexp(t, `State:\s+scheduled`, out)
		require.Regexp(t, `Policy:\s+job-cli_slow v1`, out) // policies set names it kind-job_type
		require.Regexp(t, `Next attempt:\s+\S+ \(in (1h|59m)`, out)
		require.Regexp(t, `EVENT\s+ATTEMPT\s+EXECUTOR\s+ERROR CLASS`, out)
		require.Regexp(t, `failed\s+1\s+-\s+timeout`, out, "no executor: the failure does not name one")
		require.Regexp(t, `scheduled\s+2\s+-\s+timeout\s+backoff\s+1h\s+job-cli_slow v1`, out)
		require.Contains(t, out, "retry.job.*."+a)

		var v retryView
		b.okJSON(t, &v, "retries", "show", "job/"+a)
		require.Equal(t, a, v.Retry.ItemID)
		require.Equal(t, []string{"failed", "scheduled"}, events(v.History))
	})

	t.Run("show a hold", func(t *testing.T) {
		h := contract.NewID()
		until := time.Now().Add(2 * time.Hour).UTC()
		b.held(t, contract.HeldData{
			Kind: contract.KindJob, ID: h, Attempt: 1, JobType: "cli_slow", Reason: contract.HoldPause,
			Until: &until, HoldKey: "crm", Detail: "source_paused: source is paused", Executor: "worker-h-7",
		})
		b.waitRetry(t, "job", h, "scheduled")
		out := b.ok(t, "retries", "show", "job", h)
		require.Regexp(t, `Retries used:\s+0 of 3`, out)
		require.Regexp(t, `Held:\s+pause since .*hold key crm \(uses no retry\)`, out)
		require.Regexp(t, `held\s+1\s+worker-h-7\s+.*source_paused: source is paused`, out)
		// Two hours: past the policy's max delay, not capped by it.
		require.Regexp(t, `scheduled\s+2\s+-\s+-\s+pause_until\s+(2h|1h59m)\S*\s+job-cli_slow v1\s+\S+\s+held: pause; base \S+; retry 0 of 3`, out)
	})

	t.Run("list and show holds as holds", func(t *testing.T) {
		paused, throttled := contract.NewID(), contract.NewID()
		b.held(t, contract.HeldData{Kind: contract.KindJob, ID: paused, Attempt: 1, JobType: "cli_held", Reason: contract.HoldPause,
			HoldKey: "crm", Detail: "source_paused: source is paused"})
		until := time.Now().Add(45 * time.Minute).UTC()
		b.held(t, contract.HeldData{Kind: contract.KindJob, ID: throttled, Attempt: 1, JobType: "cli_held", Reason: contract.HoldThrottle,
			Until: &until, Detail: "rate limit of 10 per 1s reached"})
		b.waitRetry(t, "job", paused, "scheduled")
		b.waitRetry(t, "job", throttled, "scheduled")

		out := b.ok(t, "retries", "list", "--job-type", "cli_held")
		// No next attempt at max_hold, and no hold reason as the last error.
		require.Regexp(t, `job\s+`+paused+`\s+held \(pause, key crm\)\s+2\s+0/5\s+until released \(at most (30d|29d23h59m)\)\s+cli_held\s+-\s+-\n`, out)
		require.Regexp(t, `job\s+`+throttled+`\s+held \(throttle\)\s+2\s+0/5\s+in (45m|44m\d*s?)\s+cli_held\s+-\s+-\n`, out)
		require.NotContains(t, out, "in 30d")

		out = b.ok(t, "retries", "show", "job", paused)
		require.Regexp(t, `State:\s+held \(state scheduled: waits on a hold, which uses no retry\)`, out)
		require.Regexp(t, `Held:\s+pause since .*hold key crm \(uses no retry\)`, out)
		require.Regexp(t, `Hold ends:\s+until released, at most until \S+ \(in (30d|29d23h59m)\)`, out)
		require.Regexp(t, `Max hold:\s+30d from held since`, out)
		require.NotContains(t, out, "Next attempt:", "a pause without an end has no next attempt")
		require.NotContains(t, out, "Last reason:", "the hold's reason is no error")
		require.NotContains(t, out, "Next check:")
		out = b.ok(t, "retries", "show", "job", throttled)
		require.Regexp(t, `Hold ends:\s+\S+ \(in (45m|44m)`, out)

		var v retryView
		b.okJSON(t, &v, "retries", "show", "job", paused)
		require.NotNil(t, v.Retry.Held)
		require.Equal(t, "crm", v.Retry.Held.Key)
		require.Nil(t, v.Retry.Held.Until)
		// Admitted after its hold, its last reason is the hold's: no error.
		admitted := contract.NewID()
		b.held(t, contract.HeldData{Kind: contract.KindJob, ID: admitted, Attempt: 1, JobType: "cli_admitted", Reason: contract.HoldConcurrency})
		b.waitRetry(t, "job", admitted, "scheduled")
		m, err := contract.NewLifecycleMsg("retryd/test", contract.Succeeded, contract.SucceededData{Kind: contract.KindJob, ID: admitted, Attempt: 2}, time.Now())
		b.publish(t, m, err)
		b.waitRetry(t, "job", admitted, "succeeded")
		out = b.ok(t, "retries", "list", "--job-type", "cli_admitted")
		require.Regexp(t, `job\s+`+admitted+`\s+succeeded\s+2\s+0/5\s+-\s+cli_admitted\s+-\s+-\n`, out)
		require.NotContains(t, out, "concurrency")

		// --all writes the rows again: the hold stays.
		var page retryPage
		b.okJSON(t, &page, "retries", "list", "--job-type", "cli_held", "--limit", "1", "--all")
		require.Len(t, page.Retries, 2)
		for _, r := range page.Retries {
			require.NotNil(t, r.Held, r.ItemID)
		}
	})

	t.Run("cancel", func(t *testing.T) {
		out := b.ok(t, "retries", "cancel", "job", a, "--reason", "customer deleted")
		require.Equal(t, "Cancelled job/"+a+" at attempt 2: state cancelled.\n", out)
		v := b.waitRetry(t, "job", a, "cancelled")
		last := v.History[len(v.History)-1]
		require.Equal(t, "cancelled", last.Event)
		require.Contains(t, string(last.Detail), "customer deleted")
		require.Contains(t, b.ok(t, "retries", "show", "job", a), "customer deleted")

		// A finished retry cannot be cancelled again: the API says 409.
		r := b.cli(t, "retries", "cancel", "job", a)
		require.Equal(t, exitFailed, r.code)
		require.Contains(t, r.stderr, "HTTP 409")
	})

	t.Run("retry", func(t *testing.T) {
		out := b.ok(t, "retries", "retry", "job", c, "--reason", "limit lifted")
		require.Contains(t, out, "Retrying job/"+c+" now: attempt 3")
		var v retryView
		b.okJSON(t, &v, "retries", "show", "job", c)
		require.Contains(t, events(v.History), "rescheduled")
		last := v.History[len(v.History)-1]
		for _, h := range v.History {
			if h.Event == "rescheduled" {
				last = h
			}
		}
		require.Equal(t, "manual", last.DecidedBy)
		require.Contains(t, string(last.Detail), "limit lifted")

		// A cancelled retry can be retried by hand.
		var res retryView
		b.okJSON(t, &res, "retries", "retry", "job", a, "--reset-attempts")
		require.Equal(t, 3, res.Retry.Attempt)
		require.Equal(t, 0, res.Retry.RetryCount)
	})

	t.Run("retry past the budget", func(t *testing.T) {
		d := contract.NewID()
		b.failed(t, contract.FailedData{
			Kind: contract.KindJob, ID: d, Attempt: 1, JobType: "cli_budget", MaxRetries: new(0),
			Error: contract.ErrorInfo{Class: "timeout", Message: "upstream timed out"},
		})
		b.waitRetry(t, "job", d, "exhausted")
		require.Regexp(t, `Retries used:\s+0 of 0\n`, b.ok(t, "retries", "show", "job", d))

		out := b.ok(t, "retries", "retry", "job", d)
		require.Equal(t, "Retrying job/"+d+" now: attempt 2, state scheduled (retries used 1, over the 0 allowed).\n"+
			"A failure of this attempt exhausts it; --reset-attempts gives it its whole budget.\n", out)
		require.Regexp(t, `Retries used:\s+1, over the 0 allowed\n`, b.ok(t, "retries", "show", "job", d))

		out = b.ok(t, "retries", "retry", "job", d, "--reset-attempts")
		require.Equal(t, "Retrying job/"+d+" now: attempt 3, state scheduled (retries used 0 of 0).\n", out)
	})

	t.Run("errors", func(t *testing.T) {
		r := b.cli(t, "retries", "show", "job", "nosuchitem")
		require.Equal(t, exitFailed, r.code)
		require.Contains(t, r.stderr, "HTTP 404")

		r = b.cli(t, "retries", "show", "job")
		require.Equal(t, exitUsage, r.code)
		require.Contains(t, r.stderr, "KIND ID")

		r = b.cli(t, "retries", "list", "--state", "bogus")
		require.Equal(t, exitUsage, r.code)
		require.Contains(t, r.stderr, `--state "bogus" is not one of`)

		r = b.cli(t, "retries", "list", "--kind", "Bad.Kind")
		require.Equal(t, exitFailed, r.code, "the API refuses it")
		require.Contains(t, r.stderr, "HTTP 400")

		r = b.cli(t, "retries", "cancel", "job", a, "--bogus-flag")
		require.Equal(t, exitUsage, r.code)

		r = cli(t, "--api", "http://127.0.0.1:1", "retries", "list")
		require.Equal(t, exitFailed, r.code)
		require.Contains(t, r.stderr, "retryd API unreachable")

		r = cli(t, "--api", "not a url", "retries", "list")
		require.Equal(t, exitUsage, r.code)
	})
}

func events(h []historyEntry) []string {
	out := make([]string, len(h))
	for i, e := range h {
		out[i] = e.Event
	}
	return out
}

func TestUsage(t *testing.T) {
	t.Parallel()
	for _, tc := range []struct {
		args []string
		code int
		want string
	}{
		{[]string{}, exitOK, "Available Commands"},
		{[]string{"bogus"}, exitUsage, `unknown command "bogus" for "retryd"`},
		{[]string{"retries"}, exitOK, "Available Commands"},
		{[]string{"retries", "lst"}, exitUsage, "did you mean list?"},
		{[]string{"retries", "list", "extra"}, exitUsage, "takes no arguments"},
		{[]string{"sources", "pause"}, exitUsage, "takes SOURCE"},
		{[]string{"policies", "get"}, exitUsage, "takes KIND [JOB_TYPE]"},
		{[]string{"--json", "--bogus"}, exitUsage, "unknown flag"},
		{[]string{"retries", "list", "--limit", "0"}, exitUsage, "--limit must be between 1 and 1000"},
		{[]string{"retries", "bulk-retry", "--status", "nope"}, exitUsage, `--status "nope"`},
		{[]string{"sources", "set", "shop"}, exitUsage, "--rate-limit N and --window"},
		{[]string{"sources", "pause", "shop", "--until", "yesterday"}, exitUsage, "--until"},
	} {
		r := cli(t, tc.args...)
		require.Equal(t, tc.code, r.code, "retryd %v: %s %s", tc.args, r.stdout, r.stderr)
		require.Contains(t, r.stdout+r.stderr, tc.want, "retryd %v", tc.args)
	}
}
