package pgtest

import (
	"context"
	"fmt"
	"strings"
	"sync"
	"testing"

	"github.com/jackc/pgx/v5"
	"github.com/stretchr/testify/require"

	"github.com/retryd/retryd/migrations"
)

func TestMain(m *testing.M) { Main(m) }

func databaseExists(t *testing.T, name string) bool {
	t.Helper()
	var exists bool
	require.NoError(t, env.admin.QueryRow(context.Background(),
		"SELECT EXISTS (SELECT 1 FROM pg_database WHERE datname = $1)", name).Scan(&exists))
	return exists
}

func TestNewPoolIsMigratedAndSeeded(t *testing.T) {
	t.Parallel()
	pool := NewPool(t)
	require.GreaterOrEqual(t, Count(t, pool, "SELECT count(*) FROM retry_policies WHERE kind IN ('*', 'event', 'event-trigger', 'job')"), 8)
	var version int64
	require.NoError(t, pool.QueryRow(context.Background(), "SELECT max(version_id) FROM goose_db_version").Scan(&version))
	require.Equal(t, migrations.Latest(), version)
}

func TestDatabasesAreIsolated(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	a, b := NewPool(t), NewPool(t)
	_, err := a.Exec(ctx, "INSERT INTO inbox (consumer, msg_id) VALUES ('c', 'm')")
	require.NoError(t, err)
	require.Zero(t, Count(t, b, "SELECT count(*) FROM inbox"))
}

func TestDatabaseDroppedOnCleanup(t *testing.T) {
	t.Parallel()
	var name string
	t.Run("uses", func(t *testing.T) {
		u := NewDatabaseURL(t)
		conn, err := pgx.Connect(context.Background(), u)
		require.NoError(t, err)
		// Left open on purpose: the drop must not wait for the test's connections.
		require.NoError(t, conn.QueryRow(context.Background(), "SELECT current_database()").Scan(&name))
		require.True(t, strings.HasPrefix(name, "test_"), name)
	})
	require.NotEmpty(t, name)
	require.False(t, databaseExists(t, name), "database %s survives its test", name)
}

// NewConn's connection keeps its session state (one connection, not a
// pool), is on a fresh migrated database, and is closed before the drop.
func TestNewConnIsOneSessionOnAFreshDatabase(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	var name string
	var conn *pgx.Conn
	t.Run("uses", func(t *testing.T) {
		conn = NewConn(t)
		_, err := conn.Exec(ctx, "SET TimeZone = 'Pacific/Auckland'")
		require.NoError(t, err)
		var zone string
		require.NoError(t, conn.QueryRow(ctx, "SELECT current_setting('TimeZone')").Scan(&zone))
		require.Equal(t, "Pacific/Auckland", zone)
		require.GreaterOrEqual(t, Count(t, conn, "SELECT count(*) FROM retry_policies"), 8)
		require.NoError(t, conn.QueryRow(ctx, "SELECT current_database()").Scan(&name))
	})
	require.True(t, conn.IsClosed(), "the connection outlives its test")
	require.False(t, databaseExists(t, name), "database %s survives its test", name)
}

func TestEmptyDatabase(t *testing.T) {
	t.Parallel()
	conn, err := pgx.Connect(context.Background(), NewEmptyDatabaseURL(t))
	require.NoError(t, err)
	defer conn.Close(context.Background())
	require.Zero(t, Count(t, conn, "SELECT count(*) FROM pg_tables WHERE schemaname = 'public'"))
}

func TestManyDatabasesInParallel(t *testing.T) {
	t.Parallel()
	for i := range 12 {
		t.Run(fmt.Sprint(i), func(t *testing.T) {
			t.Parallel()
			var one int
			require.NoError(t, NewPool(t).QueryRow(context.Background(), "SELECT 1").Scan(&one))
		})
	}
}

// Two test binaries that start at the same time against one server both
// need the template; one builds it, the other waits and reuses it. A build
// left behind by a binary that died mid-way is replaced.
func TestTemplateSharedAndRebuilt(t *testing.T) {
	t.Parallel()
	e := setup(t)
	ctx := context.Background()
	tmpl := "retryd_tmpl_test_" + randomHex(4)
	t.Cleanup(func() {
		for _, db := range []string{tmpl, tmpl + "_build"} {
			_, _ = e.admin.Exec(ctx, "ALTER DATABASE "+ident(db)+" WITH IS_TEMPLATE false")
			_, _ = e.admin.Exec(ctx, "DROP DATABASE IF EXISTS "+ident(db)+" WITH (FORCE)")
		}
	})
	_, err := e.admin.Exec(ctx, "CREATE DATABASE "+ident(tmpl+"_build"))
	require.NoError(t, err)

	var wg sync.WaitGroup
	errs := make([]error, 3)
	for i := range errs {
		wg.Go(func() {
			other := &environment{adminURL: e.adminURL, admin: e.admin, template: tmpl}
			errs[i] = other.ensureTemplate(ctx)
		})
	}
	wg.Wait()
	for _, err := range errs {
		require.NoError(t, err)
	}
	require.True(t, databaseExists(t, tmpl))
	require.False(t, databaseExists(t, tmpl+"_build"))

	other := &environment{adminURL: e.adminURL, admin: e.admin, template: tmpl}
	u := other.newDatabase(t, tmpl)
	conn, err := pgx.Connect(ctx, u)
	require.NoError(t, err)
	defer conn.Close(ctx)
	require.GreaterOrEqual(t, Count(t, conn, "SELECT count(*) FROM retry_policies"), 8)
}

func TestWithDatabase(t *testing.T) {
	t.Parallel()
	u, err := withDatabase("postgres://u:p@h:5432/postgres?sslmode=disable", "test_x")
	require.NoError(t, err)
	require.Equal(t, "postgres://u:p@h:5432/test_x?sslmode=disable", u)
	_, err = withDatabase("host=h dbname=postgres", "x")
	require.ErrorContains(t, err, EnvURL)
}

// BenchmarkNewDatabase measures one test database: create from the
// template, then drop.
func BenchmarkNewDatabase(b *testing.B) {
	e := setup(b)
	ctx := context.Background()
	for b.Loop() {
		name := "test_" + randomHex(8)
		if err := createFromTemplate(ctx, e.admin, name, e.template); err != nil {
			b.Fatal(err)
		}
		if _, err := e.admin.Exec(ctx, "DROP DATABASE "+ident(name)+" WITH (FORCE)"); err != nil {
			b.Fatal(err)
		}
	}
}

func TestCount(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	pool := NewPool(t)
	require.Zero(t, Count(t, pool, "SELECT count(*) FROM inbox"))
	for _, c := range []string{"a", "a", "b"} {
		_, err := pool.Exec(ctx, "INSERT INTO inbox (consumer, msg_id) VALUES ($1, $2)", c, randomHex(4))
		require.NoError(t, err)
	}
	require.Equal(t, 3, Count(t, pool, "SELECT count(*) FROM inbox"))
	require.Equal(t, 2, Count(t, pool, "SELECT count(*) FROM inbox WHERE consumer = $1", "a"))

	// A transaction counts its own uncommitted rows; the pool does not see them.
	tx, err := pool.Begin(ctx)
	require.NoError(t, err)
	defer func() { _ = tx.Rollback(ctx) }()
	_, err = tx.Exec(ctx, "INSERT INTO inbox (consumer, msg_id) VALUES ('b', 'in-tx')")
	require.NoError(t, err)
	require.Equal(t, 2, Count(t, tx, "SELECT count(*) FROM inbox WHERE consumer = 'b'"))
	require.Equal(t, 1, Count(t, pool, "SELECT count(*) FROM inbox WHERE consumer = 'b'"))
}

func TestStrings(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	pool := NewPool(t)
	require.Equal(t, []string{}, Strings(t, pool, "SELECT msg_id FROM inbox"))
	for _, r := range [][2]string{{"a", "m2"}, {"b", "m3"}, {"a", "m1"}} {
		_, err := pool.Exec(ctx, "INSERT INTO inbox (consumer, msg_id) VALUES ($1, $2)", r[0], r[1])
		require.NoError(t, err)
	}
	require.Equal(t, []string{"m1", "m2", "m3"}, Strings(t, pool, "SELECT msg_id FROM inbox ORDER BY msg_id"))
	require.Equal(t, []string{"m2", "m1"}, Strings(t, pool, "SELECT msg_id FROM inbox WHERE consumer = $1 ORDER BY msg_id DESC", "a"))

	// A transaction reads its own uncommitted rows; the pool does not see them.
	tx, err := pool.Begin(ctx)
	require.NoError(t, err)
	defer func() { _ = tx.Rollback(ctx) }()
	_, err = tx.Exec(ctx, "INSERT INTO inbox (consumer, msg_id) VALUES ('b', 'm4')")
	require.NoError(t, err)
	require.Equal(t, []string{"m3", "m4"}, Strings(t, tx, "SELECT msg_id FROM inbox WHERE consumer = 'b' ORDER BY msg_id"))
	require.Equal(t, []string{"m3"}, Strings(t, pool, "SELECT msg_id FROM inbox WHERE consumer = 'b' ORDER BY msg_id"))
}

// fatalRecorder records Fatalf instead of stopping the goroutine.
type fatalRecorder struct {
	testing.TB
	fatal string
}

func (r *fatalRecorder) Helper() {}

func (r *fatalRecorder) Fatalf(format string, args ...any) { r.fatal = fmt.Sprintf(format, args...) }

func TestCountFailsTheTestOnAnError(t *testing.T) {
	t.Parallel()
	r := &fatalRecorder{TB: t}
	Count(r, NewPool(t), "SELECT count(*) FROM no_such_table")
	require.Contains(t, r.fatal, "no_such_table")
}

func TestStringsFailsTheTestOnAnError(t *testing.T) {
	t.Parallel()
	pool := NewPool(t)
	r := &fatalRecorder{TB: t}
	Strings(r, pool, "SELECT name FROM no_such_table")
	require.Contains(t, r.fatal, "no_such_table")

	// An error met while reading the rows, after Query succeeded, fails
	// the test as well.
	r = &fatalRecorder{TB: t}
	Strings(r, pool, "SELECT (1 / (3 - n))::text FROM generate_series(1, 5) AS n")
	require.Contains(t, r.fatal, "division by zero")
}
