package migrations_test

import (
	"bytes"
	"context"
	"encoding/json"
	"io/fs"
	"regexp"
	"strings"
	"sync"
	"testing"
	"testing/fstest"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/rs/zerolog"
	"github.com/stretchr/testify/require"

	"github.com/retryd/retryd/migrations"
	"github.com/retryd/retryd/migrations/pgtest"
	"github.com/retryd/retryd/pkg/policy"
)

func TestMain(m *testing.M) { pgtest.Main(m) }

type bundle struct {
	url  string
	conn *pgx.Conn
}

func setup(t *testing.T) bundle {
	t.Helper()
	u := pgtest.NewEmptyDatabaseURL(t)
	conn, err := pgx.Connect(context.Background(), u)
	require.NoError(t, err)
	t.Cleanup(func() { _ = conn.Close(context.Background()) })
	return bundle{url: u, conn: conn}
}

// setupAt is setup with the schema of version: every migration applied,
// then those after version reverted, the schema a later migration
// upgrades from.
func setupAt(t *testing.T, version int64) bundle {
	t.Helper()
	b := setup(t)
	b.up(t)
	b.down(t, version)
	return b
}

// up applies every migration.
func (b bundle) up(t *testing.T) {
	t.Helper()
	require.NoError(t, migrations.Up(context.Background(), b.url, zerolog.Nop()))
}

// down reverts every migration after version.
func (b bundle) down(t *testing.T, version int64) {
	t.Helper()
	require.NoError(t, migrations.Down(context.Background(), b.url, version, zerolog.Nop()))
}

// tables lists the tables of the public schema, without goose's own.
func (b bundle) tables(t *testing.T) []string {
	t.Helper()
	return pgtest.Strings(t, b.conn,
		"SELECT tablename FROM pg_tables WHERE schemaname = 'public' AND tablename <> 'goose_db_version' ORDER BY 1")
}

func (b bundle) requireAllApplied(t *testing.T) {
	t.Helper()
	st, err := migrations.Status(context.Background(), b.url)
	require.NoError(t, err)
	require.NotEmpty(t, st)
	for _, s := range st {
		require.True(t, s.Applied, "migration %s not applied", s.Name)
		require.False(t, s.AppliedAt.IsZero())
	}
	require.Equal(t, migrations.Latest(), st[len(st)-1].Version)
	require.Zero(t, pgtest.Count(t, b.conn,
		"SELECT count(*) FROM (SELECT version_id FROM goose_db_version WHERE is_applied GROUP BY 1 HAVING count(*) > 1) d"),
		"a migration was recorded twice")
}

// foundationTables are the tables 00001_foundation.sql creates.
var foundationTables = []string{
	"event_ingress_retries", "event_source_windows", "event_sources", "inbox", "jobs", "outbox",
	"retries", "retry_history", "retry_policies", "retry_policy_versions", "workflow_events",
	"workflow_run_steps", "workflow_runs", "workflow_trigger_deliveries", "workflow_trigger_versions",
	"workflow_triggers",
}

func TestUpIsIdempotent(t *testing.T) {
	t.Parallel()
	b := setup(t)
	b.up(t)
	b.up(t)
	b.requireAllApplied(t)
	require.Subset(t, b.tables(t), foundationTables)

	require.Equal(t, len(policy.Defaults()), pgtest.Count(t, b.conn, "SELECT count(*) FROM retry_policies WHERE updated_by = 'migration'"),
		"running Up again must not seed twice")
}

func TestDownToZeroAndUpAgain(t *testing.T) {
	t.Parallel()
	b := setup(t)
	ctx := context.Background()
	b.up(t)

	b.down(t, 0)
	require.Empty(t, b.tables(t), "every migration's Down removes what its Up created")
	st, err := migrations.Status(ctx, b.url)
	require.NoError(t, err)
	for _, s := range st {
		require.False(t, s.Applied, "%s still applied after Down to 0", s.Name)
	}

	b.up(t)
	b.requireAllApplied(t)
	require.Subset(t, b.tables(t), foundationTables)
}

func TestDownToVersion(t *testing.T) {
	t.Parallel()
	b := setupAt(t, 1)
	ctx := context.Background()
	st, err := migrations.Status(ctx, b.url)
	require.NoError(t, err)
	for _, s := range st {
		require.Equal(t, s.Version <= 1, s.Applied, "%s", s.Name)
	}
	require.ElementsMatch(t, foundationTables, b.tables(t))

	require.ErrorContains(t, migrations.Down(ctx, b.url, -1, zerolog.Nop()), "negative")
}

// Every service may run Up at start: concurrent runs on separate
// connections must serialise on the advisory lock, all succeed, and apply
// each migration exactly once.
func TestConcurrentUp(t *testing.T) {
	t.Parallel()
	b := setup(t)
	// Status creates goose's version table, so the runs below race on the
	// migrations themselves rather than on creating that table (which
	// goose retries on its own).
	_, err := migrations.Status(context.Background(), b.url)
	require.NoError(t, err)
	var wg sync.WaitGroup
	errs := make([]error, 3)
	for i := range errs {
		wg.Go(func() { errs[i] = migrations.Up(context.Background(), b.url, zerolog.Nop()) })
	}
	wg.Wait()
	for _, err := range errs {
		require.NoError(t, err)
	}
	b.requireAllApplied(t)
	require.Subset(t, b.tables(t), foundationTables)
	require.Equal(t, len(policy.Defaults()), pgtest.Count(t, b.conn, "SELECT count(*) FROM retry_policy_versions WHERE changed_by = 'migration'"))
}

// The rows the migrations seed are policy.Defaults, field for field, and
// so is each one's version 1: the SQL and the Go defaults (the scheduler's
// built-in policy, backoff.Default and JobDefault) cannot drift apart.
// Rows are read in their JSON form, which is the policy API's too.
func TestSeededPolicies(t *testing.T) {
	t.Parallel()
	b := setup(t)
	ctx := context.Background()
	b.up(t)

	rows, err := b.conn.Query(ctx, `SELECT to_jsonb(p) FROM retry_policies p ORDER BY kind, job_type`)
	require.NoError(t, err)
	seeded, err := pgx.CollectRows(rows, pgx.RowTo[[]byte])
	require.NoError(t, err)
	want := policy.Defaults()
	require.Len(t, seeded, len(want))
	for i, raw := range seeded {
		var got policy.Policy
		require.NoError(t, json.Unmarshal(raw, &got), "%s", raw)
		require.Equal(t, "migration", got.UpdatedBy, got.Name)
		require.False(t, got.CreatedAt.IsZero(), got.Name)
		got.UpdatedBy, got.CreatedAt, got.UpdatedAt = "", time.Time{}, time.Time{}
		require.Equal(t, want[i], got, "%s", raw)

		var snapshot []byte
		require.NoError(t, b.conn.QueryRow(ctx,
			"SELECT policy FROM retry_policy_versions WHERE kind = $1 AND job_type = $2 AND version = 1",
			got.Kind, got.JobType).Scan(&snapshot), "version 1 of %s/%s is kept", got.Kind, got.JobType)
		require.NotContains(t, string(snapshot), "updated_at")
		var version policy.Policy
		require.NoError(t, json.Unmarshal(snapshot, &version))
		version.UpdatedBy = ""
		// 00102 and 00103 added their columns after the snapshots were
		// taken; the snapshots keep the policies as they were.
		version.MaxHold, version.MaxRetryAfter = want[i].MaxHold, want[i].MaxRetryAfter
		require.Equal(t, want[i], version, "%s", snapshot)
	}
}

func TestUpLogsEachMigration(t *testing.T) {
	t.Parallel()
	b := setup(t)
	var buf bytes.Buffer
	require.NoError(t, migrations.Up(context.Background(), b.url, zerolog.New(&buf)))

	files, err := fs.Glob(migrations.FS(), "*.sql")
	require.NoError(t, err)
	var logged []string
	for line := range strings.SplitSeq(strings.TrimSpace(buf.String()), "\n") {
		var rec map[string]any
		require.NoError(t, json.Unmarshal([]byte(line), &rec), line)
		if rec["message"] != "migration" {
			continue
		}
		require.Equal(t, "info", rec["level"])
		require.Equal(t, "up", rec["direction"])
		require.Contains(t, rec, "version")
		require.Contains(t, rec, "duration")
		logged = append(logged, rec["name"].(string))
	}
	require.Equal(t, files, logged, "one line per migration, in order")
}

// A migration runs in one transaction: when a statement fails, what the
// migration did before it is rolled back and the version stays where it
// was.
func TestFailedMigrationRollsBack(t *testing.T) {
	t.Parallel()
	b := setup(t)
	fsys := fstest.MapFS{
		"00001_a.sql": {Data: []byte("-- +goose Up\nCREATE TABLE a (id int);\n-- +goose Down\nDROP TABLE a;\n")},
		"00002_b.sql": {Data: []byte("-- +goose Up\nCREATE TABLE b (id int);\nSELECT no_such_function();\n-- +goose Down\nDROP TABLE b;\n")},
	}
	var buf bytes.Buffer
	err := migrations.UpFS(context.Background(), b.url, fsys, zerolog.New(&buf))
	require.ErrorContains(t, err, "no_such_function")
	require.Equal(t, []string{"a"}, b.tables(t))
	require.Contains(t, buf.String(), `"level":"error"`)
	require.Contains(t, buf.String(), `"name":"00002_b.sql"`)
}

// The rules for files in sql/: five-digit numbers (blocks in
// docs/design.md), an Up and a Down section, and no opting out of the
// per-migration transaction.
func TestMigrationFiles(t *testing.T) {
	t.Parallel()
	files, err := fs.Glob(migrations.FS(), "*")
	require.NoError(t, err)
	name := regexp.MustCompile(`^\d{5}_[a-z0-9_]+\.sql$`)
	seen := map[string]string{}
	for _, f := range files {
		require.Regexp(t, name, f)
		require.NotContains(t, seen, f[:5], "%s and %s share a version", f, seen[f[:5]])
		seen[f[:5]] = f
		b, err := fs.ReadFile(migrations.FS(), f)
		require.NoError(t, err)
		body := string(b)
		require.Contains(t, body, "-- +goose Up", f)
		require.Contains(t, body, "-- +goose Down", f)
		require.NotContains(t, strings.ToUpper(body), "+GOOSE NO TRANSACTION", "%s must run in a transaction", f)
	}
	require.Contains(t, seen, "00001")
}

func TestFingerprint(t *testing.T) {
	t.Parallel()
	fp := migrations.Fingerprint()
	require.Len(t, fp, 16)
	require.Equal(t, fp, migrations.Fingerprint())
	require.GreaterOrEqual(t, migrations.Latest(), int64(1))
}

func TestBadURL(t *testing.T) {
	t.Parallel()
	require.Error(t, migrations.Up(context.Background(), "postgres://%zz", zerolog.Nop()))
	_, err := migrations.Status(context.Background(), "::not a url")
	require.Error(t, err)
}
