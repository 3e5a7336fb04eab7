package main

import (
	"encoding/json"
	"os"
	"path/filepath"
	"strings"
	"testing"

	"github.com/stretchr/testify/require"

	"github.com/retryd/retryd/internal/streams"
	"github.com/retryd/retryd/migrations"
	"github.com/retryd/retryd/migrations/pgtest"
	"github.com/retryd/retryd/pkg/contract"
)

func TestSimulate(t *testing.T) {
	t.Parallel()

	t.Run("ad-hoc", func(t *testing.T) {
		// No server needed: the policy is made of the flags.
		out := cli(t, "--api", "http://127.0.0.1:1", "simulate", "--base-delay", "2h", "--max-delay", "24h",
			"--jitter", "additive", "--jitter-max", "5m", "--max-retries", "5")
		require.Equal(t, exitOK, out.code, out.stderr)
		require.Contains(t, out.stdout, "ad-hoc policy: 5 retries, 2h x2 capped at 24h, jitter +0..5m")
		require.Regexp(t, `1\s+2\s+2h\s+2h \.\. 2h5m\s+2h \.\. 2h5m`, out.stdout)
		require.Regexp(t, `5\s+6\s+24h\s+24h \.\. 24h5m\s+2d6h \.\. 2d6h25m`, out.stdout)

		var sim simulationOut
		r := cli(t, "simulate", "--base-delay", "1s", "--jitter", "full", "--retries", "3", "--json")
		require.Equal(t, exitOK, r.code, r.stderr)
		require.NoError(t, json.Unmarshal([]byte(r.stdout), &sim))
		require.Len(t, sim.Steps, 3)
		require.Equal(t, simulatedStep{Retry: 3, Attempt: 4, BaseDelayMS: 4000, MinDelayMS: 0, MaxDelayMS: 4000,
			CumulativeMinMS: 0, CumulativeMaxMS: 7000}, sim.Steps[2])

		// A backoff per error class: each class's schedule after the
		// policy's; --class shows one.
		classes := `{"rate_limit":{"base_delay_ms":60000,"max_delay_ms":3600000,"jitter":"none"},"timeout":{"first_delay_ms":0}}`
		r = cli(t, "simulate", "--base-delay", "1s", "--jitter", "none", "--max-retries", "3", "--class-backoff", classes)
		require.Equal(t, exitOK, r.code, r.stderr)
		require.Contains(t, r.stdout, "Errors of class rate_limit (their own backoff)")
		require.Regexp(t, `(?s)class rate_limit.*3\s+4\s+4m\s+4m\s+7m`, r.stdout)
		require.Regexp(t, `(?s)class timeout.*1\s+2\s+0s\s+0s\s+0s\s+2\s+3\s+2s\s+2s\s+2s`, r.stdout)
		r = cli(t, "simulate", "--base-delay", "1s", "--jitter", "none", "--max-retries", "2", "--class-backoff", classes, "--class", "timeout", "--json")
		require.Equal(t, exitOK, r.code, r.stderr)
		sim = simulationOut{}
		require.NoError(t, json.Unmarshal([]byte(r.stdout), &sim))
		require.Contains(t, sim.Policy, "errors of class timeout")
		require.Equal(t, []int64{0, 2000}, []int64{sim.Steps[0].MaxDelayMS, sim.Steps[1].MaxDelayMS})
		r = cli(t, "simulate", "--max-retries", "2", "--class-backoff", classes, "--json")
		require.Equal(t, exitOK, r.code, r.stderr)
		sim = simulationOut{}
		require.NoError(t, json.Unmarshal([]byte(r.stdout), &sim))
		require.Len(t, sim.Classes, 2)
		require.EqualValues(t, 60000, sim.Classes["rate_limit"][0].MaxDelayMS)

		r = cli(t, "simulate", "--max-retries", "0")
		require.Equal(t, exitOK, r.code)
		require.Contains(t, r.stdout, "No retries: the first failure is final.")

		for _, args := range [][]string{
			{"simulate", "--job-type", "x"},
			{"simulate", "--multiplier", "0.5"},
			{"simulate", "--base-delay", "10s", "--max-delay", "1s"},
			{"simulate", "--jitter", "sometimes"},
			{"simulate", "--retries", "5000"},
			{"simulate", "--class-backoff", "rate_limit=1m"},
			{"simulate", "--class-backoff", `{"slow":{}}`},
			{"simulate", "--class-backoff", `{"network":{"base_delay_ms":3600000}}`},
			{"simulate", "--class", "sometimes"},
		} {
			r := cli(t, args...)
			require.Equal(t, exitUsage, r.code, "%v: %s", args, r.stderr)
		}
	})

	t.Run("policy from the API", func(t *testing.T) {
		b := setup(t, nil)
		b.ok(t, "policies", "set", "job", "sim_type", "--max-retries", "3", "--base-delay", "1s", "--max-delay", "3s", "--jitter", "none")
		out := b.ok(t, "simulate", "--kind", "job", "--job-type", "sim_type")
		require.Contains(t, out, "policy job/sim_type (job-sim_type v1): 3 retries")
		require.Regexp(t, `3\s+4\s+3s\s+3s\s+6s`, out)

		// No policy of its own: the kind's default governs it.
		out = b.ok(t, "simulate", "--kind", "job", "--job-type", "unknown_type", "--retries", "2")
		require.Contains(t, out, "policy job/_ (job-default v1)")
		// An unknown kind falls back to "*".
		out = b.ok(t, "simulate", "--kind", "custom-kind")
		require.Contains(t, out, "policy */_ (default v1)")
		// Flags change the policy read.
		out = b.ok(t, "simulate", "--kind", "job", "--job-type", "sim_type", "--max-delay", "10s")
		require.Regexp(t, `3\s+4\s+4s\s+4s\s+7s`, out)
	})
}

func TestMigrate(t *testing.T) {
	t.Parallel()
	url := pgtest.NewEmptyDatabaseURL(t)

	r := cli(t, "migrate", "--database-url", url, "--status")
	require.Equal(t, exitOK, r.code, r.stderr)
	require.Contains(t, r.stdout, "pending")
	require.Contains(t, r.stdout, "migration(s) pending: run retryd migrate.")

	r = cli(t, "migrate", "--database-url", url)
	require.Equal(t, exitOK, r.code, r.stderr)
	require.Contains(t, r.stdout, "00001_foundation.sql")
	require.Contains(t, r.stdout, "Schema up to date")
	require.Contains(t, r.stderr, "migration", "progress is logged on stderr")

	// Idempotent, and --json lists every migration as applied.
	r = cli(t, "migrate", "--database-url", url, "--json")
	require.Equal(t, exitOK, r.code, r.stderr)
	var status []migrations.MigrationStatus
	require.NoError(t, json.Unmarshal([]byte(r.stdout), &status))
	require.NotEmpty(t, status)
	for _, s := range status {
		require.True(t, s.Applied, "%s", s.Name)
	}

	r = cli(t, "migrate", "--database-url", "postgres://nobody@127.0.0.1:1/none?sslmode=disable&connect_timeout=2")
	require.Equal(t, exitFailed, r.code)
}

// TestMigrateNeedsURL changes the environment: not parallel.
func TestMigrateNeedsURL(t *testing.T) {
	t.Setenv("DATABASE_URL", "")
	r := cli(t, "migrate")
	require.Equal(t, exitUsage, r.code)
	require.Contains(t, r.stderr, "set DATABASE_URL or --database-url")
}

func TestStreamsCommands(t *testing.T) {
	t.Parallel()

	t.Run("export", func(t *testing.T) {
		dir := filepath.Join(t.TempDir(), "streams")
		r := cli(t, "streams", "export", "--dir", dir, "--replicas", "3")
		require.Equal(t, exitOK, r.code, r.stderr)
		for _, name := range streams.Names {
			require.Contains(t, r.stdout, filepath.Join(dir, name+".json"))
			raw, err := os.ReadFile(filepath.Join(dir, name+".json"))
			require.NoError(t, err)
			var cfg map[string]any
			require.NoError(t, json.Unmarshal(raw, &cfg))
			require.Equal(t, name, cfg["name"])
			require.EqualValues(t, 3, cfg["num_replicas"])
		}
		// The R1 export is the file checked in under deploy/streams.
		dir1 := t.TempDir()
		require.Equal(t, exitOK, cli(t, "streams", "export", "--dir", dir1).code)
		got, err := os.ReadFile(filepath.Join(dir1, "RETRIES.json"))
		require.NoError(t, err)
		want, err := os.ReadFile("../../deploy/streams/RETRIES.json")
		require.NoError(t, err)
		require.Equal(t, string(want), string(got))

		require.Equal(t, exitUsage, cli(t, "streams", "export").code)
		require.Equal(t, exitUsage, cli(t, "streams", "export", "--dir", dir, "--replicas", "9").code)
	})

	t.Run("ensure and list", func(t *testing.T) {
		b := setup(t, nil)
		nats := b.stack.NATSURL()
		r := b.cli(t, "streams", "ensure", "--nats-url", nats)
		require.Equal(t, exitOK, r.code, r.stderr)
		require.Regexp(t, `RETRIES\s+retry\.\*\.\*\.\*\s+\d+\s+\d+\s+\d+\s+1`, r.stdout)

		// A deleted stream shows as missing and ensure brings it back.
		require.NoError(t, b.stack.JS.DeleteStream(b.ctx, "RUNS"))
		out := b.ok(t, "streams", "list", "--nats-url", nats)
		require.Regexp(t, `RUNS\s+runs\.\*\.\*\.\*\s+missing`, out)
		require.Contains(t, out, "1 stream(s) missing")
		b.ok(t, "streams", "ensure", "--nats-url", nats)
		var rows []streamRow
		b.okJSON(t, &rows, "streams", "list", "--nats-url", nats)
		require.Len(t, rows, len(streams.Names))
		for _, row := range rows {
			require.True(t, row.Exists, row.Name)
		}

		// A split RETRIES says so (RETRYD_SHARDS is process-wide: the
		// split is made here, not through the environment).
		require.NotContains(t, out, "split into")
		require.NoError(t, streams.Ensure(b.ctx, b.stack.JS, streams.Options{Shards: 2}))
		require.Contains(t, b.ok(t, "streams", "list", "--nats-url", nats), "RETRIES is split into 2 scheduler shards")
		b.okJSON(t, &rows, "streams", "list", "--nats-url", nats)
		for _, row := range rows {
			if row.Name == contract.StreamRetries {
				require.Equal(t, 2, row.Shards)
			}
		}

		r = cli(t, "--timeout", "1s", "streams", "list", "--nats-url", "nats://127.0.0.1:1")
		require.Equal(t, exitFailed, r.code)
		require.True(t, strings.Contains(r.stderr, "connect to nats"), r.stderr)
	})
}
