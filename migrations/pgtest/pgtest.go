// Package pgtest gives each test its own freshly migrated Postgres
// database, and the login roles a test of grants connects as
// (ServiceRoles, CreateRoles, URLAs).
//
// The server is TEST_DATABASE_URL when set (a superuser URL; databases are
// created on that server) and otherwise a throwaway cluster started from
// the installed binaries (pgcluster), once per test binary. The schema is
// migrated once into a template database named after migrations.Fingerprint,
// and every test gets `CREATE DATABASE test_<random> TEMPLATE <template>`,
// which takes milliseconds. Test binaries running at the same time against
// the same server share the template safely.
//
// Packages that use pgtest call Main from TestMain:
//
//	func TestMain(m *testing.M) { pgtest.Main(m) }
//
//	func TestSomething(t *testing.T) {
//		t.Parallel()
//		pool := pgtest.NewPool(t)
//		...
//	}
package pgtest

import (
	"context"
	"crypto/rand"
	"encoding/hex"
	"errors"
	"fmt"
	"hash/fnv"
	"net/url"
	"os"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgconn"
	"github.com/jackc/pgx/v5/pgxpool"
	"github.com/rs/zerolog"

	"github.com/retryd/retryd/migrations"
	"github.com/retryd/retryd/migrations/pgcluster"
)

// EnvURL names the environment variable with the admin URL of a server to
// create test databases on.
const EnvURL = "TEST_DATABASE_URL"

const setupTimeout = 2 * time.Minute

var (
	mainCalled atomic.Bool

	envOnce sync.Once
	env     *environment
	envErr  error
)

type environment struct {
	adminURL string
	admin    *pgxpool.Pool
	cluster  *pgcluster.Cluster // nil when EnvURL is set
	template string
}

// Main runs the tests and then stops the throwaway cluster, if one was
// started, before exiting with the tests' exit code.
func Main(m *testing.M) {
	mainCalled.Store(true)
	code := m.Run()
	if err := shutdown(); err != nil {
		fmt.Fprintf(os.Stderr, "pgtest: %v\n", err)
		if code == 0 {
			code = 1
		}
	}
	os.Exit(code)
}

// NewDatabaseURL creates a fresh migrated database and returns its URL, for
// code that opens its own connections (services, subprocesses). The
// database is dropped in t.Cleanup, closing any connection left open.
func NewDatabaseURL(t testing.TB) string {
	t.Helper()
	e := setup(t)
	return e.newDatabase(t, e.template)
}

// NewEmptyDatabaseURL is NewDatabaseURL without the schema: an empty
// database (copied from template0), for tests of the migrations themselves.
func NewEmptyDatabaseURL(t testing.TB) string {
	t.Helper()
	e := setup(t)
	return e.newDatabase(t, "template0")
}

func (e *environment) newDatabase(t testing.TB, template string) string {
	t.Helper()
	name := "test_" + randomHex(8)
	ctx, cancel := context.WithTimeout(context.Background(), setupTimeout)
	defer cancel()
	if err := createFromTemplate(ctx, e.admin, name, template); err != nil {
		t.Fatalf("pgtest: %v", err)
	}
	t.Cleanup(func() {
		ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
		defer cancel()
		if _, err := e.admin.Exec(ctx, "DROP DATABASE IF EXISTS "+ident(name)+" WITH (FORCE)"); err != nil {
			t.Errorf("pgtest: drop database %s: %v", name, err)
		}
	})
	u, err := withDatabase(e.adminURL, name)
	if err != nil {
		t.Fatalf("pgtest: %v", err)
	}
	return u
}

// NewPool creates a fresh migrated database and returns a pool on it. The
// pool is closed and the database dropped in t.Cleanup.
func NewPool(t testing.TB) *pgxpool.Pool {
	t.Helper()
	u := NewDatabaseURL(t)
	ctx, cancel := context.WithTimeout(context.Background(), setupTimeout)
	defer cancel()
	pool, err := pgxpool.New(ctx, u)
	if err != nil {
		t.Fatalf("pgtest: open pool: %v", err)
	}
	t.Cleanup(pool.Close) // runs before the drop registered by NewDatabaseURL
	return pool
}

// NewConn creates a fresh migrated database and returns one connection to
// it, for tests that set session state (a time zone, enable_seqscan) that
// a pool would spread over connections it opens later. The connection is
// closed and the database dropped in t.Cleanup.
func NewConn(t testing.TB) *pgx.Conn {
	t.Helper()
	u := NewDatabaseURL(t)
	ctx, cancel := context.WithTimeout(context.Background(), setupTimeout)
	defer cancel()
	conn, err := pgx.Connect(ctx, u)
	if err != nil {
		t.Fatalf("pgtest: connect: %v", err)
	}
	t.Cleanup(func() { _ = conn.Close(context.Background()) }) // runs before the drop
	return conn
}

func setup(t testing.TB) *environment {
	t.Helper()
	if !mainCalled.Load() {
		t.Fatalf("pgtest: call pgtest.Main(m) from TestMain in this package, so the test Postgres is stopped when the tests end")
	}
	envOnce.Do(func() {
		ctx, cancel := context.WithTimeout(context.Background(), setupTimeout)
		defer cancel()
		env, envErr = newEnvironment(ctx)
	})
	if envErr != nil {
		t.Fatalf("pgtest: %v", envErr)
	}
	return env
}

func newEnvironment(ctx context.Context) (_ *environment, err error) {
	e := &environment{template: "retryd_tmpl_" + migrations.Fingerprint()}
	defer func() {
		if err != nil {
			_ = e.close()
		}
	}()
	e.adminURL = os.Getenv(EnvURL)
	if e.adminURL == "" {
		c, err := pgcluster.Start(ctx, pgcluster.Options{})
		if err != nil {
			return nil, fmt.Errorf("start throwaway postgres (or set %s): %w", EnvURL, err)
		}
		e.cluster = c
		e.adminURL = c.URL("postgres")
	}
	if _, err := withDatabase(e.adminURL, "x"); err != nil {
		return nil, err
	}
	cfg, err := pgxpool.ParseConfig(e.adminURL)
	if err != nil {
		return nil, fmt.Errorf("parse %s: %w", EnvURL, err)
	}
	cfg.MaxConns = 4
	if e.admin, err = pgxpool.NewWithConfig(ctx, cfg); err != nil {
		return nil, fmt.Errorf("connect to admin database: %w", err)
	}
	if err := e.ensureTemplate(ctx); err != nil {
		return nil, err
	}
	return e, nil
}

// ensureTemplate builds the template database unless a complete one
// exists. The template is built under another name and renamed when
// complete, so its name existing means it is ready; the advisory lock keeps
// concurrent test binaries from building it twice.
func (e *environment) ensureTemplate(ctx context.Context) error {
	conn, err := e.admin.Acquire(ctx)
	if err != nil {
		return fmt.Errorf("acquire admin connection: %w", err)
	}
	defer conn.Release()
	key := lockKey(e.template)
	if _, err := conn.Exec(ctx, "SELECT pg_advisory_lock($1)", key); err != nil {
		return fmt.Errorf("lock template %s: %w", e.template, err)
	}
	defer func() {
		_, _ = conn.Exec(context.WithoutCancel(ctx), "SELECT pg_advisory_unlock($1)", key)
	}()

	var exists bool
	if err := conn.QueryRow(ctx, "SELECT EXISTS (SELECT 1 FROM pg_database WHERE datname = $1)", e.template).Scan(&exists); err != nil {
		return fmt.Errorf("look up template %s: %w", e.template, err)
	}
	if exists {
		return nil
	}
	build := e.template + "_build"
	// A build left behind by a test binary that died mid-way.
	if _, err := conn.Exec(ctx, "DROP DATABASE IF EXISTS "+ident(build)+" WITH (FORCE)"); err != nil {
		return fmt.Errorf("drop stale template build: %w", err)
	}
	if _, err := conn.Exec(ctx, "CREATE DATABASE "+ident(build)); err != nil {
		return fmt.Errorf("create template build: %w", err)
	}
	buildURL, err := withDatabase(e.adminURL, build)
	if err != nil {
		return err
	}
	if err := migrations.Up(ctx, buildURL, zerolog.Nop()); err != nil {
		return fmt.Errorf("migrate template: %w", err)
	}
	// Nobody may connect to the template: a connection would make CREATE
	// DATABASE ... TEMPLATE fail for every test running meanwhile.
	if err := retryInUse(ctx, func() error {
		_, err := conn.Exec(ctx, "ALTER DATABASE "+ident(build)+" WITH ALLOW_CONNECTIONS false IS_TEMPLATE true")
		return err
	}); err != nil {
		return fmt.Errorf("seal template: %w", err)
	}
	if err := retryInUse(ctx, func() error {
		_, err := conn.Exec(ctx, "ALTER DATABASE "+ident(build)+" RENAME TO "+ident(e.template))
		return err
	}); err != nil {
		return fmt.Errorf("rename template: %w", err)
	}
	return nil
}

func createFromTemplate(ctx context.Context, admin *pgxpool.Pool, name, template string) error {
	err := retryInUse(ctx, func() error {
		_, err := admin.Exec(ctx, "CREATE DATABASE "+ident(name)+" TEMPLATE "+ident(template))
		return err
	})
	if err != nil {
		return fmt.Errorf("create database %s from %s: %w", name, template, err)
	}
	return nil
}

// retryInUse retries fn while Postgres reports the database is being
// accessed by other users (SQLSTATE 55006): the backend of a connection
// that was just closed can take a moment to exit.
func retryInUse(ctx context.Context, fn func() error) error {
	wait := 5 * time.Millisecond
	for {
		err := fn()
		var pgErr *pgconn.PgError
		if err == nil || !errors.As(err, &pgErr) || pgErr.Code != "55006" {
			return err
		}
		select {
		case <-ctx.Done():
			return fmt.Errorf("%w (gave up: %w)", err, ctx.Err())
		case <-time.After(wait):
		}
		wait = min(wait*2, 200*time.Millisecond)
	}
}

func shutdown() error {
	if env == nil {
		return nil
	}
	return env.close()
}

func (e *environment) close() error {
	if e.admin != nil {
		e.admin.Close()
	}
	if e.cluster == nil {
		return nil
	}
	ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
	defer cancel()
	if err := e.cluster.Stop(ctx); err != nil {
		return fmt.Errorf("stop throwaway postgres: %w", err)
	}
	return nil
}

func withDatabase(adminURL, db string) (string, error) {
	u, err := url.Parse(adminURL)
	if err != nil || (u.Scheme != "postgres" && u.Scheme != "postgresql") {
		return "", fmt.Errorf("%s must be a postgres:// URL", EnvURL)
	}
	u.Path = "/" + db
	u.RawPath = ""
	return u.String(), nil
}

func lockKey(s string) int64 {
	h := fnv.New64a()
	h.Write([]byte("retryd pgtest " + s))
	return int64(h.Sum64())
}

func ident(name string) string { return pgx.Identifier{name}.Sanitize() }

func randomHex(n int) string {
	b := make([]byte, n)
	_, _ = rand.Read(b)
	return hex.EncodeToString(b)
}
