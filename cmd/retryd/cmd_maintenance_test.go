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
	require.Contains(t, r.stdout, "Dry run: nothing changed.")

	run := func() retention.TableReport {
		t.Helper()
		r := cli(t, "maintenance", "--database-url", url, "--ahead", "10d", "--history-retention", "90d", "--json")
		require.Equal(t, exitOK, r.code, r.stderr)
		require.Empty(t, r.stderr, "--json logs nothing")
		var rep retention.Report
		require.NoError(t, json.Unmarshal([]byte(r.stdout), &rep), r.stdout)
		require.False(t, rep.DryRun)
		require.Len(t, rep.Tables, 1)
		require.Equal(t, "90d", rep.Tables[0].Retention)
		return rep.Tables[0]
	}
	require.NotEmpty(t, run().Created)
	require.Empty(t, run().Created, "the second run has nothing to do")

	r = cli(t, "maintenance", "--database-url", url)
	require.Equal(t, exitOK, r.code, r.stderr)
	require.Contains(t, r.stderr, "retention", "progress is logged on stderr")

	for _, tc := range []usageCase{
		{[]string{"maintenance", "--database-url", url, "--history-retention", "0d"}, "--history-retention"},
		{[]string{"maintenance", "--database-url", url, "--history-retention", "a month"}, "--history-retention"},
		{[]string{"maintenance", "--database-url", url, "--ahead", "-1d"}, "--ahead"},
	} {
		r := cli(t, tc.args...)
		require.Equal(t, exitUsage, r.code, "%v", tc.args)
		require.Contains(t, r.stderr, tc.want)
	}
	r = cli(t, "maintenance", "--database-url", "postgres://nobody@127.0.0.1:1/none?sslmode=disable&connect_timeout=2")
	require.Equal(t, exitFailed, r.code)
}
