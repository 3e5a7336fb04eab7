package main

import (
	"encoding/json"
	"testing"

	"github.com/stretchr/testify/require"

	"github.com/retryd/retryd/migrations/pgtest"
	"github.com/retryd/retryd/projections/retention"
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
