package main

import (
	"context"
	"encoding/json"
	"testing"
	"time"

	"github.com/stretchr/testify/require"

	"github.com/retryd/retryd/internal/natstest"
	"github.com/retryd/retryd/internal/streams"
	"github.com/retryd/retryd/migrations/pgtest"
	"github.com/retryd/retryd/stores/retention"
)

func TestMaintenance(t *testing.T) {
	t.Parallel()
	url := pgtest.NewDatabaseURL(t)

	// 00109 created the partitions of the next week; ten days ahead needs
	// more, which a dry run only names.
	r := cli(t, "maintenance", "--database-url", url, "--ahead", "10d", "--dry-run")
	require.Equal(t, exitOK, r.code, r.stderr)
	require.Contains(t, r.stdout, "would create")
	require.Contains(t, r.stdout, "retry_history keeps rows from")
	require.Contains(t, r.stdout, "audit_log keeps rows from")
	require.Contains(t, r.stdout, "retries keeps terminal rows from")
	require.Contains(t, r.stdout, "0 row(s) would be deleted")
	require.Contains(t, r.stdout, "Dry run: nothing changed.")

	run := func(args ...string) map[string]retention.TableReport {
		t.Helper()
		r := cli(t, append([]string{"maintenance", "--database-url", url, "--ahead", "10d", "--json"}, args...)...)
		require.Equal(t, exitOK, r.code, r.stderr)
		require.Empty(t, r.stderr, "--json logs nothing")
		var rep retention.Report
		require.NoError(t, json.Unmarshal([]byte(r.stdout), &rep), r.stdout)
		require.False(t, rep.DryRun)
		out := map[string]retention.TableReport{}
		for _, tr := range rep.Tables {
			out[tr.Table] = tr
		}
		require.Len(t, out, len(retention.Tables))
		return out
	}
	first := run("--history-retention", "90d", "--retention", "jobs=45d")
	require.Equal(t, "90d", first["retry_history"].Retention, "--history-retention still works")
	require.Equal(t, "45d", first["jobs"].Retention)
	require.Equal(t, "30d", first["retries"].Retention, "the default")
	require.Equal(t, "365d", first["audit_log"].Retention)
	require.Equal(t, retention.MethodRows, first["retries"].Method)
	require.NotEmpty(t, first["retry_history"].Created)
	second := run("--retention", "retry_history=90d", "--retention", "audit_log=730d")
	require.Equal(t, "90d", second["retry_history"].Retention)
	require.Equal(t, "730d", second["audit_log"].Retention)
	require.Empty(t, second["retry_history"].Created, "the second run has nothing to do")
	require.Empty(t, second["audit_log"].Created)

	r = cli(t, "maintenance", "--database-url", url)
	require.Equal(t, exitOK, r.code, r.stderr)
	require.Contains(t, r.stderr, "retention", "progress is logged on stderr")

	for _, tc := range []usageCase{
		{[]string{"maintenance", "--database-url", url, "--history-retention", "0d"}, "--history-retention"},
		{[]string{"maintenance", "--database-url", url, "--history-retention", "a month"}, "--history-retention"},
		{[]string{"maintenance", "--database-url", url, "--ahead", "-1d"}, "--ahead"},
		{[]string{"maintenance", "--database-url", url, "--retention", "histroy=30d"}, "--retention"},
		{[]string{"maintenance", "--database-url", url, "--retention", "jobs"}, "--retention"},
		{[]string{"maintenance", "--database-url", url, "--retention", "jobs=0d"}, "--retention"},
		{[]string{"maintenance", "--database-url", url, "--retention", "jobs=1d", "--retention", "jobs=2d"}, "twice"},
		{[]string{"maintenance", "--database-url", url, "--retention", "retry_history=1d", "--history-retention", "2d"}, "--history-retention"},
		{[]string{"maintenance", "--database-url", url, "--batch", "0"}, "--batch"},
	} {
		r := cli(t, tc.args...)
		require.Equal(t, exitUsage, r.code, "%v", tc.args)
		require.Contains(t, r.stderr, tc.want)
	}
	r = cli(t, "maintenance", "--database-url", "postgres://nobody@127.0.0.1:1/none?sslmode=disable&connect_timeout=2")
	require.Equal(t, exitFailed, r.code)
}

// An item table's retention may not be shorter than the max age of the
// stream whose replays its rows refuse. Without NATS the max ages are the
// defaults (the test environment sets no RETRYD_STREAM_*_MAX_AGE).
func TestMaintenanceRefusesRetentionShorterThanItsStream(t *testing.T) {
	t.Parallel()
	url := pgtest.NewDatabaseURL(t)
	for _, tc := range []struct {
		arg, stream, age string
	}{
		{"workflow_events=3d", "INGEST", "7d"},
		{"workflow_trigger_deliveries=6d", "EVENTS", "7d"},
		{"workflow_runs=36h", "RUNS", "7d"},
		{"retries=7d", "RETRIES", "30d"},
		{"jobs=29d", "RETRIES", "30d"},
	} {
		r := cli(t, "maintenance", "--database-url", url, "--retention", tc.arg)
		require.Equal(t, exitUsage, r.code, "%s: %s", tc.arg, r.stdout)
		for _, want := range []string{"--retention " + tc.arg, "the " + tc.stream + " stream's max_age " + tc.age,
			"RETRYD_STREAM_" + tc.stream + "_MAX_AGE", "the default"} {
			require.Contains(t, r.stderr, want, tc.arg)
		}
		require.Empty(t, r.stdout, "refused before any change")
	}
	// The floor itself is allowed, and said.
	r := cli(t, "maintenance", "--database-url", url, "--retention", "workflow_events=7d", "--dry-run")
	require.Equal(t, exitOK, r.code, r.stderr)
	require.Contains(t, r.stdout, "INGEST max_age 7d (default, RETRYD_STREAM_INGEST_MAX_AGE unset): the floor of workflow_events.")
	require.Contains(t, r.stdout, "workflow_events keeps terminal rows from")
	require.Contains(t, r.stdout, "(7d, at least INGEST's max_age 7d)")
}

// With NATS, the max ages are the streams' own: a stream kept longer than
// the default raises the defaults of the tables it floors and refuses a
// shorter --retention; an unreachable server falls back to the defaults
// and says so.
func TestMaintenanceReadsStreamMaxAgesFromNATS(t *testing.T) {
	t.Parallel()
	url := pgtest.NewDatabaseURL(t)
	srv := natstest.RunServer(t)
	_, js := natstest.Connect(t, srv)
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	require.NoError(t, streams.Ensure(ctx, js, streams.Options{MaxAge: map[string]time.Duration{
		"RETRIES": 40 * 24 * time.Hour, "EVENTS": 10 * 24 * time.Hour,
	}}))

	r := cli(t, "maintenance", "--database-url", url, "--nats-url", srv.ClientURL(), "--json", "--dry-run")
	require.Equal(t, exitOK, r.code, r.stderr)
	var rep retention.Report
	require.NoError(t, json.Unmarshal([]byte(r.stdout), &rep), r.stdout)
	ages := map[string]retention.StreamAge{}
	for _, s := range rep.Streams {
		ages[s.Stream] = s
	}
	require.Equal(t, retention.StreamAge{Stream: "RETRIES", MaxAge: "40d", From: "nats", Tables: []string{"retries", "jobs"}}, ages["RETRIES"])
	require.Equal(t, "10d", ages["EVENTS"].MaxAge)
	require.Equal(t, "nats", ages["INGEST"].From)
	kept := map[string]retention.TableReport{}
	for _, tr := range rep.Tables {
		kept[tr.Table] = tr
	}
	require.Equal(t, "40d", kept["retries"].Retention, "the default 30d raised to RETRIES's 40d")
	require.Equal(t, "40d", kept["jobs"].Retention)
	require.Equal(t, "30d", kept["workflow_trigger_deliveries"].Retention, "30d is past EVENTS's 10d")
	require.Equal(t, "10d", kept["workflow_trigger_deliveries"].Floor)

	r = cli(t, "maintenance", "--database-url", url, "--nats-url", srv.ClientURL(), "--retention", "jobs=30d")
	require.Equal(t, exitUsage, r.code, r.stdout)
	require.Contains(t, r.stderr, "the RETRIES stream's max_age 40d (read from NATS)")

	r = cli(t, "maintenance", "--database-url", url, "--nats-url", "nats://127.0.0.1:1", "--dry-run")
	require.Equal(t, exitOK, r.code, r.stderr)
	require.Contains(t, r.stderr, "NATS not read")
	require.Contains(t, r.stdout, "RETRIES max_age 30d (default, RETRYD_STREAM_RETRIES_MAX_AGE unset)")
}
