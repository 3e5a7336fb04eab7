package main

import (
	"encoding/json"
	"strings"
	"testing"
	"time"

	"github.com/stretchr/testify/require"

	"github.com/retryd/retryd/pkg/errclass"
	"github.com/retryd/retryd/pkg/policy"
)

func TestSourcesCommands(t *testing.T) {
	t.Parallel()
	b := setup(t, nil)

	require.Equal(t, "No source has a gate configured.\n", b.ok(t, "sources", "list"))

	out := b.ok(t, "sources", "set", "shop", "--rate-limit", "5", "--window", "1s", "--allowed-types", "order.created,order.paid")
	require.Regexp(t, `Rate limit:\s+5 per 1s`, out)
	require.Regexp(t, `Allowed types:\s+order.created,order.paid`, out)

	out = b.ok(t, "sources", "list")
	require.Regexp(t, `shop\s+5 per 1s\s+no\s+0\s+order.created,order.paid`, out)

	out = b.ok(t, "sources", "pause", "shop", "--reason", "partner maintenance", "--until", "10m")
	require.Regexp(t, `Paused:\s+until \S+ \(in (10m|9m)`, out)
	require.Regexp(t, `Pause reason:\s+partner maintenance`, out)

	var s sourceView
	b.okJSON(t, &s, "sources", "show", "shop")
	require.True(t, s.Paused)
	require.NotNil(t, s.PausedUntil)
	require.WithinDuration(t, time.Now().Add(10*time.Minute), *s.PausedUntil, time.Minute)

	// An event of a paused source is held as a retry of kind event, due
	// when the pause ends, however long that is; a resume releases it at
	// once, no manual retry needed.
	b.postEvent(t, `{"id":"evt-paused-1","source":"shop","type":"order.created","data":{"total":12}}`)
	v := b.waitRetry(t, "event", "evt-paused-1", "scheduled")
	require.Equal(t, "pause_until", v.History[len(v.History)-1].DecidedBy)
	out = b.ok(t, "retries", "list", "--kind", "event", "--source", "shop")
	require.Regexp(t, `event\s+evt-paused-1\s+held \(pause, key shop\)\s+2\s+0/\d+\s+in (10m|9m)`, out)
	r := b.cli(t, "sources", "resume", "shop")
	require.Equal(t, exitOK, r.code, r.stderr)
	require.Regexp(t, `Paused:\s+no`, r.stdout)
	v = b.waitRetry(t, "event", "evt-paused-1", "succeeded")
	require.Contains(t, historyDecisions(v.History), "resume")

	var list struct {
		Sources []sourceView `json:"sources"`
	}
	b.okJSON(t, &list, "sources", "list")
	require.Len(t, list.Sources, 1)
	require.False(t, list.Sources[0].Paused)

	out = b.ok(t, "sources", "set", "shop", "--no-limit")
	require.Regexp(t, `Rate limit:\s+none`, out)

	r = b.cli(t, "sources", "resume", "nosuch")
	require.Equal(t, exitFailed, r.code)
	require.Contains(t, r.stderr, "HTTP 404")
	r = b.cli(t, "sources", "show", "nosuch")
	require.Equal(t, exitFailed, r.code)
	r = b.cli(t, "sources", "set", "shop", "--rate-limit", "5", "--window", "soon")
	require.Equal(t, exitUsage, r.code)
	for _, n := range []string{"-5", "0"} {
		r = b.cli(t, "sources", "set", "shop", "--rate-limit", n, "--window", "1s")
		require.Equal(t, exitUsage, r.code)
		require.Contains(t, r.stderr, "--rate-limit "+n+": the events admitted per window must be 1 or more (--no-limit removes the limit)")
	}
	r = b.cli(t, "sources", "set", "shop", "--rate-limit", "5")
	require.Equal(t, exitUsage, r.code)
	require.Contains(t, r.stderr, "give --rate-limit N and --window DURATION together, or --no-limit")
	r = b.cli(t, "sources", "pause", "Bad Source")
	require.Equal(t, exitFailed, r.code, "the API refuses the name")
	require.Contains(t, r.stderr, "HTTP 400")
}

func TestPoliciesCommands(t *testing.T) {
	t.Parallel()
	b := setup(t, nil)

	out := b.ok(t, "policies", "list")
	require.Regexp(t, `job\s+_\s+job-default\s+1\s+5\s+2h\s+2\s+24h\s+\+0..5m\s+true`, out)
	require.Regexp(t, `\*\s+_\s+default`, out)

	out = b.ok(t, "policies", "get", "job")
	require.Regexp(t, `Name:\s+job-default`, out)
	require.Regexp(t, `Backoff:\s+2h x2, capped at 24h`, out)
	require.Regexp(t, `Non-retryable classes:\s+authentication,permission,validation`, out)

	out = b.ok(t, "policies", "set", "job", "cli_new", "--max-retries", "2", "--base-delay", "1s", "--max-delay", "10s", "--name", "cli-new")
	require.Contains(t, out, "Policy job/cli_new is now version 1.")
	out = b.ok(t, "policies", "set", "job", "cli_new", "--max-retries", "4", "--non-retryable", "validation", "--retryable", "permission")
	require.Contains(t, out, "Policy job/cli_new is now version 2.")
	var p policy.Policy
	b.okJSON(t, &p, "policies", "get", "job", "cli_new")
	require.Equal(t, 4, p.MaxRetries)
	require.Equal(t, time.Second, p.Backoff.Base, "flags left out keep their value")
	require.Equal(t, "cli-new", p.Name)
	require.Equal(t, []errclass.Class{errclass.Permission}, p.RetryableClasses)
	require.Equal(t, []errclass.Class{errclass.Validation}, p.NonRetryableClasses)

	out = b.ok(t, "policies", "set", "job", "cli_new", "--max-hold", "48h", "--max-retry-after", "2h")
	require.Regexp(t, `Max hold:\s+2d`, out)
	require.Regexp(t, `Max retry-after:\s+2h`, out)
	out = b.ok(t, "policies", "set", "job", "cli_new", "--class-backoff", `{"timeout":{"first_delay_ms":0},"rate_limit":{"base_delay_ms":5000}}`)
	require.Regexp(t, `Class backoff:\s+rate_limit: 5s x2 capped at 10s; timeout: first retry after 0s, then 1s x2 capped at 10s`, out)
	b.okJSON(t, &p, "policies", "get", "job", "cli_new")
	require.Len(t, p.ClassBackoff, 2)
	out = b.ok(t, "policies", "set", "job", "cli_new", "--enabled=false")
	require.Regexp(t, `Enabled:\s+false`, out)
	require.Regexp(t, `Max hold:\s+2d`, out, "flags left out keep their value")
	require.Regexp(t, `Class backoff:\s+rate_limit: 5s`, out, "flags left out keep their value")

	out = b.ok(t, "policies", "versions", "job", "cli_new")
	lines := strings.Split(strings.TrimSpace(out), "\n")
	require.Len(t, lines, 6, out)
	require.Regexp(t, `^5\s+`, lines[1], "newest first")
	var versions struct {
		Versions []policyVersion `json:"versions"`
	}
	b.okJSON(t, &versions, "policies", "versions", "job", "cli_new")
	require.Len(t, versions.Versions, 5)
	var v1 map[string]any
	require.NoError(t, json.Unmarshal(versions.Versions[4].Policy, &v1))
	require.EqualValues(t, 2, v1["max_retries"])

	// The kind's default by "_" or by leaving the job type out.
	out = b.ok(t, "policies", "set", "event", "_", "--max-retries", "7")
	require.Contains(t, out, "Policy event/_ is now version 2.")
	b.okJSON(t, &p, "policies", "get", "event")
	require.Equal(t, 7, p.MaxRetries)

	r := b.cli(t, "policies", "get", "job", "nosuch")
	require.Equal(t, exitFailed, r.code)
	require.Contains(t, r.stderr, "HTTP 404")
	r = b.cli(t, "policies", "set", "job", "brand_new", "--max-retries", "1")
	require.Equal(t, exitUsage, r.code)
	require.Contains(t, r.stderr, "does not exist yet")
	r = b.cli(t, "policies", "set", "job", "cli_new", "--jitter", "bogus")
	require.Equal(t, exitUsage, r.code)
	r = b.cli(t, "policies", "set", "job", "cli_new", "--max-delay", "1ms")
	require.Equal(t, exitFailed, r.code, "the scheduler validates the policy")
	require.Contains(t, r.stderr, "max_delay_ms")
	require.Contains(t, r.stderr, "HTTP 400")
}

func historyDecisions(h []historyEntry) []string {
	var out []string
	for _, e := range h {
		if e.DecidedBy != "" {
			out = append(out, e.DecidedBy)
		}
	}
	return out
}
