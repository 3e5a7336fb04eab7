package pgcluster_test

import (
	"context"
	"errors"
	"os"
	"os/exec"
	"path/filepath"
	"strconv"
	"syscall"
	"testing"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/stretchr/testify/require"

	"github.com/retryd/retryd/migrations/pgcluster"
)

func start(t *testing.T, opts pgcluster.Options) *pgcluster.Cluster {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
	defer cancel()
	c, err := pgcluster.Start(ctx, opts)
	if errors.Is(err, pgcluster.ErrNoPostgres) {
		t.Fatalf("%v", err) // CI installs postgresql-15; a missing install is a failure, not a skip
	}
	require.NoError(t, err)
	t.Cleanup(func() { _ = c.Stop(context.Background()) })
	return c
}

func connect(t *testing.T, url string) *pgx.Conn {
	t.Helper()
	conn, err := pgx.Connect(context.Background(), url)
	require.NoError(t, err)
	t.Cleanup(func() { _ = conn.Close(context.Background()) })
	return conn
}

func setting(t *testing.T, conn *pgx.Conn, name string) string {
	t.Helper()
	var v string
	require.NoError(t, conn.QueryRow(context.Background(), "SELECT current_setting($1)", name).Scan(&v))
	return v
}

func TestThrowawayCluster(t *testing.T) {
	t.Parallel()
	c := start(t, pgcluster.Options{})
	conn := connect(t, c.URL("postgres"))

	require.Equal(t, "off", setting(t, conn, "fsync"))
	require.Equal(t, "off", setting(t, conn, "synchronous_commit"))
	require.Equal(t, "off", setting(t, conn, "full_page_writes"))
	require.Equal(t, "300", setting(t, conn, "max_connections"))
	require.Equal(t, "127.0.0.1", setting(t, conn, "listen_addresses"))
	require.Equal(t, c.DataDir(), setting(t, conn, "unix_socket_directories"))

	if os.Geteuid() == 0 {
		fi, err := os.Stat(c.DataDir())
		require.NoError(t, err)
		require.NotZero(t, fi.Sys().(*syscall.Stat_t).Uid, "data directory must belong to the postgres user, not root")
	}

	require.NoError(t, conn.Close(context.Background()))
	require.NoError(t, c.Stop(context.Background()))
	require.NoError(t, c.Stop(context.Background()), "Stop is idempotent")
	_, err := os.Stat(filepath.Dir(c.DataDir()))
	require.ErrorIs(t, err, os.ErrNotExist, "Stop removes the throwaway directory")
	_, err = pgx.Connect(context.Background(), c.URL("postgres"))
	require.Error(t, err, "server is gone after Stop")
}

func TestPersistentDataDir(t *testing.T) {
	t.Parallel()
	parent := t.TempDir()
	if os.Geteuid() == 0 {
		// t.TempDir is 0700 root: the postgres user must be able to reach
		// the data directory below it.
		require.NoError(t, os.Chmod(parent, 0o755))
		require.NoError(t, os.Chmod(filepath.Dir(parent), 0o755))
	}
	dir := filepath.Join(parent, "pgdata")
	ctx := context.Background()

	c := start(t, pgcluster.Options{DataDir: dir})
	conn := connect(t, c.URL("postgres"))
	require.Equal(t, "on", setting(t, conn, "fsync"), "a persistent cluster keeps its data safe")
	_, err := conn.Exec(ctx, "CREATE TABLE kept (v int); INSERT INTO kept VALUES (42)")
	require.NoError(t, err)
	require.NoError(t, conn.Close(ctx))
	require.NoError(t, c.Stop(ctx))
	_, err = os.Stat(filepath.Join(dir, "PG_VERSION"))
	require.NoError(t, err, "Stop keeps a persistent data directory")

	c2 := start(t, pgcluster.Options{DataDir: dir})
	var v int
	require.NoError(t, connect(t, c2.URL("postgres")).QueryRow(ctx, "SELECT v FROM kept").Scan(&v))
	require.Equal(t, 42, v)

	// A dev runner killed hard left the server running: the next start
	// uses it instead of failing.
	c3 := start(t, pgcluster.Options{DataDir: dir})
	require.Equal(t, c2.Port(), c3.Port())
	require.NoError(t, connect(t, c3.URL("postgres")).QueryRow(ctx, "SELECT v FROM kept").Scan(&v))
}

func TestNoPostgres(t *testing.T) {
	t.Parallel()
	_, err := pgcluster.Start(context.Background(), pgcluster.Options{BinDir: t.TempDir()})
	require.ErrorIs(t, err, pgcluster.ErrNoPostgres)
	require.Contains(t, err.Error(), "apt-get install postgresql-15")
}

// A test binary killed before Stop leaves its server running; the next
// throwaway cluster stops it and removes its directory.
func TestOrphanReaped(t *testing.T) {
	t.Parallel()
	orphan := start(t, pgcluster.Options{})
	dead := exec.Command("true")
	require.NoError(t, dead.Run())
	base := filepath.Dir(orphan.DataDir())
	require.NoError(t, os.WriteFile(filepath.Join(base, "owner.pid"), []byte(strconv.Itoa(dead.Process.Pid)), 0o644))

	start(t, pgcluster.Options{})
	_, err := os.Stat(base)
	require.ErrorIs(t, err, os.ErrNotExist)
	_, err = pgx.Connect(context.Background(), orphan.URL("postgres"))
	require.Error(t, err, "the orphan server was stopped")
}
