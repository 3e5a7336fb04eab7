// Package pgcluster starts a local PostgreSQL server from the installed
// binaries: a throwaway one for tests (pgtest uses it when
// TEST_DATABASE_URL is unset) and a persistent one for `retryd dev` when
// DATABASE_URL is unset.
//
// The server listens on 127.0.0.1 only, trusts every local connection and
// is run as the `postgres` OS user when the process runs as root (initdb
// refuses root). A throwaway cluster turns fsync, synchronous_commit and
// full_page_writes off: it lives as long as one test binary, so crash
// safety buys nothing and costs time.
package pgcluster

import (
	"bytes"
	"context"
	"errors"
	"fmt"
	"io"
	"net"
	"net/url"
	"os"
	"os/exec"
	"os/user"
	"path/filepath"
	"strconv"
	"strings"
	"sync"
	"syscall"
	"time"

	"github.com/jackc/pgx/v5"

	"github.com/retryd/retryd/internal/freeaddr"
)

// Superuser is the role initdb creates; URL connects as it.
const Superuser = "postgres"

// Options configures Start. The zero value starts a throwaway cluster in a
// new temporary directory on a free port.
type Options struct {
	// DataDir keeps the cluster in this directory across runs: it is
	// initialised on first use, reused afterwards and never removed. Empty
	// means a temporary directory removed by Stop.
	DataDir string
	// Port to listen on (127.0.0.1). 0 picks a free port.
	Port int
	// Log receives the output of initdb and pg_ctl. The server's own log
	// is written to Cluster.LogPath.
	Log io.Writer
	// BinDir holds initdb, pg_ctl and postgres. Empty searches PATH, then
	// the newest /usr/lib/postgresql/<major>/bin.
	BinDir string
	// StartTimeout bounds how long the server may take to accept
	// connections. Default 60s.
	StartTimeout time.Duration
}

// Cluster is a running PostgreSQL server started by Start.
type Cluster struct {
	binDir    string
	dataDir   string
	tempDir   string // removed by Stop; "" for a persistent DataDir
	logPath   string
	port      int
	cred      *syscall.Credential
	log       io.Writer
	persisted bool

	stopOnce sync.Once
	stopErr  error
}

// Start initialises the data directory if needed, starts the server and
// waits until it accepts connections. It returns ErrNoPostgres when the
// binaries are not installed.
func Start(ctx context.Context, opts Options) (*Cluster, error) {
	binDir, err := FindBinDir(opts.BinDir)
	if err != nil {
		return nil, err
	}
	cred, err := ServerCredential()
	if err != nil {
		return nil, err
	}
	c := &Cluster{binDir: binDir, cred: cred, log: opts.Log, persisted: opts.DataDir != ""}
	if c.log == nil {
		c.log = io.Discard
	}
	if opts.StartTimeout <= 0 {
		opts.StartTimeout = 60 * time.Second
	}
	if err := c.prepareDirs(opts.DataDir); err != nil {
		return nil, err
	}
	if !c.persisted {
		c.reapOrphans(ctx)
	}
	ok := false
	defer func() {
		if !ok && c.tempDir != "" {
			_ = os.RemoveAll(c.tempDir)
		}
	}()
	if _, err := os.Stat(filepath.Join(c.dataDir, "PG_VERSION")); errors.Is(err, os.ErrNotExist) {
		if err := c.initdb(ctx); err != nil {
			return nil, err
		}
	} else if err != nil {
		return nil, fmt.Errorf("inspect data directory: %w", err)
	}

	if c.persisted {
		// A dev runner killed hard leaves its server running (pg_ctl
		// detaches it); use that server rather than fail to start a second.
		if port, running := c.runningPort(ctx); running {
			c.port = port
			if err := c.waitReady(ctx, opts.StartTimeout); err != nil {
				return nil, err
			}
			fmt.Fprintf(c.log, "pgcluster: reusing the server already running on %s (port %d)\n", c.dataDir, port)
			ok = true
			return c, nil
		}
	}
	// A free port can be taken by someone else between our probe and the
	// server's bind; pick another one a few times before giving up.
	tries := 1
	if opts.Port == 0 {
		tries = 5
	}
	for i := 0; ; i++ {
		c.port = opts.Port
		if c.port == 0 {
			if c.port, err = freeaddr.Port(); err != nil {
				return nil, err
			}
		}
		err = c.start(ctx, opts.StartTimeout)
		if err == nil {
			break
		}
		if i+1 >= tries || !errors.Is(err, errPortInUse) {
			return nil, err
		}
	}
	if err := c.waitReady(ctx, opts.StartTimeout); err != nil {
		_ = c.pgctlStop(context.WithoutCancel(ctx), "immediate")
		return nil, err
	}
	ok = true
	return c, nil
}

// URL is the connection URL of database db as the superuser, e.g.
// postgres://postgres@127.0.0.1:54321/postgres?sslmode=disable.
func (c *Cluster) URL(db string) string {
	u := url.URL{
		Scheme:   "postgres",
		User:     url.User(Superuser),
		Host:     net.JoinHostPort("127.0.0.1", strconv.Itoa(c.port)),
		Path:     "/" + db,
		RawQuery: "sslmode=disable",
	}
	return u.String()
}

// Port is the TCP port the server listens on.
func (c *Cluster) Port() int { return c.port }

// DataDir is the cluster's data directory.
func (c *Cluster) DataDir() string { return c.dataDir }

// Stop stops the server and, for a throwaway cluster, removes its
// directory. A throwaway cluster is stopped in immediate mode (nothing in
// it must survive); a persistent one in fast mode, so the next start needs
// no crash recovery. Calling Stop again returns the first result.
func (c *Cluster) Stop(ctx context.Context) error {
	c.stopOnce.Do(func() {
		mode := "immediate"
		if c.persisted {
			mode = "fast"
		}
		c.stopErr = c.pgctlStop(ctx, mode)
		if c.tempDir != "" {
			if err := os.RemoveAll(c.tempDir); err != nil && c.stopErr == nil {
				c.stopErr = fmt.Errorf("remove cluster directory: %w", err)
			}
		}
	})
	return c.stopErr
}

func (c *Cluster) prepareDirs(dataDir string) error {
	if dataDir == "" {
		base, err := os.MkdirTemp("", tempPrefix)
		if err != nil {
			return fmt.Errorf("create cluster directory: %w", err)
		}
		c.tempDir = base
		c.dataDir = filepath.Join(base, "data")
		c.logPath = filepath.Join(base, "postgres.log")
		if err := writeOwner(base); err != nil {
			_ = os.RemoveAll(base)
			return fmt.Errorf("create cluster directory: %w", err)
		}
		return GiveToServer(base, c.cred)
	}
	abs, err := filepath.Abs(dataDir)
	if err != nil {
		return fmt.Errorf("resolve data directory: %w", err)
	}
	c.dataDir = abs
	c.logPath = filepath.Join(abs, "postgres.log")
	if _, err := os.Stat(abs); errors.Is(err, os.ErrNotExist) {
		if err := os.MkdirAll(abs, 0o700); err != nil {
			return fmt.Errorf("create data directory: %w", err)
		}
		return GiveToServer(abs, c.cred)
	} else if err != nil {
		return fmt.Errorf("inspect data directory: %w", err)
	}
	return nil
}

func (c *Cluster) initdb(ctx context.Context) error {
	err := c.run(ctx, "initdb",
		"-D", c.dataDir,
		"-U", Superuser,
		"-A", "trust",
		"-E", "UTF8",
		"--no-locale",
		"--no-instructions",
		"--no-sync",
	)
	if err != nil {
		return fmt.Errorf("initdb %s: %w", c.dataDir, err)
	}
	return nil
}

var errPortInUse = errors.New("port in use")

func (c *Cluster) start(ctx context.Context, timeout time.Duration) error {
	err := c.run(ctx, "pg_ctl", "start",
		"-D", c.dataDir,
		"-l", c.logPath,
		"-w", "-t", strconv.Itoa(int(timeout.Seconds())),
		"-o", c.serverOptions(),
	)
	if err == nil {
		return nil
	}
	logTail := tail(c.logPath, 2048)
	if strings.Contains(logTail, "could not bind") || strings.Contains(logTail, "already in use") {
		err = fmt.Errorf("%w: %w", errPortInUse, err)
	}
	return fmt.Errorf("start postgres on port %d: %w\nserver log %s:\n%s", c.port, err, c.logPath, logTail)
}

// serverOptions are the postgres command-line settings, passed through
// pg_ctl's -o (which runs them through /bin/sh, hence the quoting).
func (c *Cluster) serverOptions() string {
	settings := [][2]string{
		{"listen_addresses", "127.0.0.1"},
		{"port", strconv.Itoa(c.port)},
		{"unix_socket_directories", c.socketDir()},
		{"max_connections", "300"},
	}
	if !c.persisted {
		settings = append(settings,
			[2]string{"fsync", "off"},
			[2]string{"synchronous_commit", "off"},
			[2]string{"full_page_writes", "off"},
		)
	}
	var b strings.Builder
	for i, s := range settings {
		if i > 0 {
			b.WriteByte(' ')
		}
		b.WriteString("-c ")
		b.WriteString(shellQuote(s[0] + "=" + s[1]))
	}
	return b.String()
}

// socketDir keeps the Unix socket inside the data directory so clusters
// never collide in /var/run/postgresql. A socket path longer than the
// kernel's limit (107 bytes) would stop the server from starting, so a
// deep data directory gets TCP only.
func (c *Cluster) socketDir() string {
	if len(c.dataDir)+len("/.s.PGSQL.65535") > 100 {
		return ""
	}
	return c.dataDir
}

func (c *Cluster) waitReady(ctx context.Context, timeout time.Duration) error {
	ctx, cancel := context.WithTimeout(ctx, timeout)
	defer cancel()
	var lastErr error
	for {
		conn, err := pgx.Connect(ctx, c.URL("postgres"))
		if err == nil {
			err = conn.Ping(ctx)
			_ = conn.Close(context.WithoutCancel(ctx))
			if err == nil {
				return nil
			}
		}
		lastErr = err
		select {
		case <-ctx.Done():
			return fmt.Errorf("wait for postgres on port %d: %w (last error: %v)", c.port, ctx.Err(), lastErr)
		case <-time.After(20 * time.Millisecond):
		}
	}
}

// runningPort reports the port of a server already running on the data
// directory, from its postmaster.pid (line 4).
func (c *Cluster) runningPort(ctx context.Context) (int, bool) {
	b, err := os.ReadFile(filepath.Join(c.dataDir, "postmaster.pid"))
	if err != nil {
		return 0, false // cleanly stopped
	}
	// The pid file may be stale (the server died with the machine).
	if err := c.run(ctx, "pg_ctl", "status", "-D", c.dataDir); err != nil {
		return 0, false
	}
	lines := strings.Split(string(b), "\n")
	if len(lines) < 4 {
		return 0, false
	}
	port, err := strconv.Atoi(strings.TrimSpace(lines[3]))
	return port, err == nil && port > 0
}

func (c *Cluster) pgctlStop(ctx context.Context, mode string) error {
	if err := c.run(ctx, "pg_ctl", "stop", "-D", c.dataDir, "-m", mode, "-w"); err != nil {
		return fmt.Errorf("stop postgres: %w", err)
	}
	return nil
}

// run runs one of the PostgreSQL binaries as the server's OS user. Its
// output goes to the configured log and, on failure, into the error.
func (c *Cluster) run(ctx context.Context, name string, args ...string) error {
	cmd := exec.CommandContext(ctx, filepath.Join(c.binDir, name), args...)
	var out bytes.Buffer
	cmd.Stdout = io.MultiWriter(&out, c.log)
	cmd.Stderr = cmd.Stdout
	cmd.Env = ServerEnv()
	// The server user may not be allowed into the caller's directory.
	cmd.Dir = c.dataDir
	if c.tempDir != "" {
		cmd.Dir = c.tempDir // the data directory does not exist before initdb
	}
	if c.cred != nil {
		cmd.SysProcAttr = &syscall.SysProcAttr{Credential: c.cred}
	}
	if err := cmd.Run(); err != nil {
		if c.cred != nil && errors.Is(err, os.ErrPermission) {
			return fmt.Errorf("%s: %w (the postgres OS user must be able to enter %s and every directory above it)", name, err, cmd.Dir)
		}
		return fmt.Errorf("%s: %w: %s", name, err, strings.TrimSpace(out.String()))
	}
	return nil
}

// GiveToServer makes path belong to cred, the server's OS user from
// ServerCredential, so that initdb and postgres can write in it; with a
// nil cred (not root) there is nothing to do.
func GiveToServer(path string, cred *syscall.Credential) error {
	if cred == nil {
		return nil
	}
	if err := os.Chown(path, int(cred.Uid), int(cred.Gid)); err != nil {
		return fmt.Errorf("give %s to the postgres user: %w", path, err)
	}
	return nil
}

// ServerCredential is the postgres OS user when running as root (initdb
// and postgres refuse to run as root), nil otherwise: the user to run the
// server's programs as.
func ServerCredential() (*syscall.Credential, error) {
	if os.Geteuid() != 0 {
		return nil, nil
	}
	u, err := user.Lookup("postgres")
	if err != nil {
		return nil, fmt.Errorf("look up OS user postgres (needed to run postgres as root): %w", err)
	}
	uid, err := strconv.ParseUint(u.Uid, 10, 32)
	if err != nil {
		return nil, fmt.Errorf("parse uid of postgres: %w", err)
	}
	gid, err := strconv.ParseUint(u.Gid, 10, 32)
	if err != nil {
		return nil, fmt.Errorf("parse gid of postgres: %w", err)
	}
	return &syscall.Credential{Uid: uint32(uid), Gid: uint32(gid)}, nil
}

// ServerEnv is the environment to run the server's programs in: the
// caller's without its PG* variables, as PGDATA, PGPORT and friends would
// otherwise change what pg_ctl and postgres do.
func ServerEnv() []string {
	var env []string
	for _, kv := range os.Environ() {
		if !strings.HasPrefix(kv, "PG") {
			env = append(env, kv)
		}
	}
	return env
}

func shellQuote(s string) string {
	return "'" + strings.ReplaceAll(s, "'", `'\''`) + "'"
}

func tail(path string, n int64) string {
	f, err := os.Open(path)
	if err != nil {
		return "(no server log)"
	}
	defer f.Close()
	fi, err := f.Stat()
	if err != nil {
		return "(no server log)"
	}
	off := max(fi.Size()-n, 0)
	buf := make([]byte, fi.Size()-off)
	if _, err := f.ReadAt(buf, off); err != nil && !errors.Is(err, io.EOF) {
		return "(unreadable server log)"
	}
	return string(buf)
}
