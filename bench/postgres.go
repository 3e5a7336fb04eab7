package main

import (
	"context"
	"fmt"
	"net/url"
	"os"
	"path/filepath"
	"strconv"
	"strings"
	"sync"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgxpool"

	"github.com/retryd/retryd/migrations/pgcluster"
)

// pgServer is the one Postgres server of a run. Every system gets its own
// database on it, so retryd and River compete for the same disk, WAL and
// buffers, which is the comparison a user makes.
type pgServer struct {
	admin      string
	cluster    *pgcluster.Cluster
	syncCommit string // "" leaves the server's setting
	// noStatements says why pg_stat_statements is not usable ("" if it is).
	noStatements string
}

// pgTuning is applied to a cluster the bench starts itself. Durability is
// left at the PostgreSQL defaults (fsync on, synchronous_commit on); only
// memory and checkpoint spacing are raised, as anyone running 1M pending
// rows would.
var pgTuning = []string{
	"shared_buffers = '1GB'",
	"max_wal_size = '8GB'",
	"checkpoint_timeout = '15min'",
	"max_connections = 300",
	// For the per-cycle cost breakdown (statements per cycle); it adds a
	// counter update per statement, not an fsync.
	"shared_preload_libraries = 'pg_stat_statements'",
}

// startPostgres connects to adminURL, or starts a cluster in a temporary
// directory with default durability when adminURL is empty.
func startPostgres(ctx context.Context, adminURL, syncCommit string) (*pgServer, error) {
	p := &pgServer{admin: adminURL, syncCommit: syncCommit}
	if adminURL == "" {
		// A DataDir makes pgcluster keep PostgreSQL's durability defaults
		// (its throwaway mode turns fsync off, which would flatter every
		// Postgres-backed system). The directory is removed by stop.
		dir, err := os.MkdirTemp("", "retryd-bench-pg-")
		if err != nil {
			return nil, fmt.Errorf("create postgres directory: %w", err)
		}
		if err := os.Chmod(dir, 0o755); err != nil {
			return nil, fmt.Errorf("create postgres directory: %w", err)
		}
		c, err := pgcluster.Start(ctx, pgcluster.Options{DataDir: dir + "/data"})
		if err != nil {
			_ = os.RemoveAll(dir)
			return nil, fmt.Errorf("start postgres: %w", err)
		}
		if err := tune(ctx, c.URL("postgres")); err != nil {
			_ = c.Stop(ctx)
			_ = os.RemoveAll(dir)
			return nil, err
		}
		// shared_buffers needs a restart.
		if err := c.Stop(ctx); err != nil {
			_ = os.RemoveAll(dir)
			return nil, fmt.Errorf("restart postgres: %w", err)
		}
		c, err = pgcluster.Start(ctx, pgcluster.Options{DataDir: dir + "/data", Port: c.Port()})
		if err != nil {
			_ = os.RemoveAll(dir)
			return nil, fmt.Errorf("restart postgres: %w", err)
		}
		p.cluster = c
		p.admin = c.URL("postgres")
		cleanupDirs.add(dir)
	}
	conn, err := pgx.Connect(ctx, p.admin)
	if err != nil {
		return nil, fmt.Errorf("connect to postgres: %w", err)
	}
	defer conn.Close(ctx)
	// pg_stat_statements shows every database's statements from the admin
	// database. A server given by URL may not preload it: the cost
	// breakdown then says the figure is unavailable.
	if _, err := conn.Exec(ctx, "CREATE EXTENSION IF NOT EXISTS pg_stat_statements"); err != nil {
		p.noStatements = err.Error()
	} else if _, err := conn.Exec(ctx, "SELECT 1 FROM pg_stat_statements LIMIT 1"); err != nil {
		// The extension installs without the library; the view then
		// fails ("must be loaded via shared_preload_libraries").
		p.noStatements = err.Error()
	}
	return p, nil
}

func tune(ctx context.Context, url string) error {
	conn, err := pgx.Connect(ctx, url)
	if err != nil {
		return fmt.Errorf("connect to postgres: %w", err)
	}
	defer conn.Close(ctx)
	for _, s := range pgTuning {
		if _, err := conn.Exec(ctx, "ALTER SYSTEM SET "+s); err != nil {
			return fmt.Errorf("tune postgres (%s): %w", s, err)
		}
	}
	return nil
}

// postmasterPID returns the pid of the server's postmaster, from
// postmaster.pid in its data directory. For a server given by URL that
// works only when it runs on this machine and the bench may read its data
// directory; the CPU figure of Postgres is unavailable otherwise.
func (p *pgServer) postmasterPID(ctx context.Context) (int, error) {
	dir := ""
	if p.cluster != nil {
		dir = p.cluster.DataDir()
	} else {
		conn, err := pgx.Connect(ctx, p.admin)
		if err != nil {
			return 0, fmt.Errorf("connect to postgres: %w", err)
		}
		defer conn.Close(ctx)
		if err := conn.QueryRow(ctx, "SHOW data_directory").Scan(&dir); err != nil {
			return 0, fmt.Errorf("show data_directory: %w", err)
		}
	}
	b, err := os.ReadFile(filepath.Join(dir, "postmaster.pid"))
	if err != nil {
		return 0, fmt.Errorf("read postmaster.pid: %w", err)
	}
	first, _, _ := strings.Cut(string(b), "\n")
	pid, err := strconv.Atoi(strings.TrimSpace(first))
	if err != nil {
		return 0, fmt.Errorf("parse postmaster.pid: %w", err)
	}
	// A stale file of another server, or one in another pid namespace.
	if _, err := readProcStat(pid); err != nil {
		return 0, fmt.Errorf("postmaster %d: %w", pid, err)
	}
	return pid, nil
}

func (p *pgServer) stop(ctx context.Context) {
	if p.cluster != nil {
		_ = p.cluster.Stop(ctx)
	}
}

// createDB (re)creates database name and returns its URL. Each scenario run
// gets a fresh database so earlier runs leave no bloat behind.
func (p *pgServer) createDB(ctx context.Context, name string) (string, error) {
	conn, err := pgx.Connect(ctx, p.admin)
	if err != nil {
		return "", fmt.Errorf("connect to postgres: %w", err)
	}
	defer conn.Close(ctx)
	ident := pgx.Identifier{name}.Sanitize()
	if _, err := conn.Exec(ctx, "DROP DATABASE IF EXISTS "+ident+" WITH (FORCE)"); err != nil {
		return "", fmt.Errorf("drop database %s: %w", name, err)
	}
	if _, err := conn.Exec(ctx, "CREATE DATABASE "+ident); err != nil {
		return "", fmt.Errorf("create database %s: %w", name, err)
	}
	if p.syncCommit != "" {
		if _, err := conn.Exec(ctx, "ALTER DATABASE "+ident+" SET synchronous_commit = "+pgx.Identifier{p.syncCommit}.Sanitize()); err != nil {
			return "", fmt.Errorf("set synchronous_commit on %s: %w", name, err)
		}
	}
	return withDatabase(p.admin, name)
}

// dropDB removes a database a scenario no longer needs (1M-row databases
// add up).
func (p *pgServer) dropDB(ctx context.Context, name string) {
	conn, err := pgx.Connect(ctx, p.admin)
	if err != nil {
		return
	}
	defer conn.Close(ctx)
	_, _ = conn.Exec(ctx, "DROP DATABASE IF EXISTS "+pgx.Identifier{name}.Sanitize()+" WITH (FORCE)")
}

// durability describes how durable a commit is on the pool's database.
func durability(ctx context.Context, pool *pgxpool.Pool) string {
	var sc, fs string
	if err := pool.QueryRow(ctx, "SELECT current_setting('synchronous_commit'), current_setting('fsync')").Scan(&sc, &fs); err != nil {
		return "unknown (" + err.Error() + ")"
	}
	return "synchronous_commit=" + sc + " fsync=" + fs
}

func serverVersion(ctx context.Context, p *pgServer) string {
	conn, err := pgx.Connect(ctx, p.admin)
	if err != nil {
		return "unknown"
	}
	defer conn.Close(ctx)
	var v string
	if err := conn.QueryRow(ctx, "SHOW server_version").Scan(&v); err != nil {
		return "unknown"
	}
	return v
}

func withDatabase(admin, db string) (string, error) {
	u, err := url.Parse(admin)
	if err != nil {
		return "", fmt.Errorf("parse database URL: %w", err)
	}
	u.Path = "/" + db
	return u.String(), nil
}

// newPool opens a pool on url sized for a benchmark (pgxpool's default of
// max(4, cores) would be the bottleneck on this machine, not Postgres).
func newPool(ctx context.Context, url string, maxConns int32) (*pgxpool.Pool, error) {
	cfg, err := pgxpool.ParseConfig(url)
	if err != nil {
		return nil, fmt.Errorf("parse database URL: %w", err)
	}
	cfg.MaxConns = maxConns
	pool, err := pgxpool.NewWithConfig(ctx, cfg)
	if err != nil {
		return nil, fmt.Errorf("open pool: %w", err)
	}
	if err := pool.Ping(ctx); err != nil {
		pool.Close()
		return nil, fmt.Errorf("ping postgres: %w", err)
	}
	return pool, nil
}

// dbCounter names databases uniquely within a run.
var dbCounter struct {
	sync.Mutex
	n int
}

func dbName(prefix string) string {
	dbCounter.Lock()
	defer dbCounter.Unlock()
	dbCounter.n++
	return fmt.Sprintf("bench_%s_%d", strings.ReplaceAll(prefix, "-", "_"), dbCounter.n)
}

// cleanupDirs are temporary directories removed when the run ends.
var cleanupDirs dirList

type dirList struct {
	mu   sync.Mutex
	dirs []string
}

func (d *dirList) add(dir string) {
	d.mu.Lock()
	defer d.mu.Unlock()
	d.dirs = append(d.dirs, dir)
}

func (d *dirList) removeAll() {
	d.mu.Lock()
	defer d.mu.Unlock()
	for _, dir := range d.dirs {
		_ = os.RemoveAll(dir)
	}
	d.dirs = nil
}
