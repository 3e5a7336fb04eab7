package harness

import (
	"bytes"
	"context"
	"fmt"
	"net/url"
	"os"
	"os/exec"
	"path/filepath"
	"strconv"
	"strings"
	"syscall"
	"time"

	"github.com/jackc/pgx/v5"

	"github.com/retryd/retryd/internal/freeaddr"
	"github.com/retryd/retryd/migrations/pgcluster"
)

// Postgres is a Postgres cluster the suite controls: it can be stopped in
// fast or immediate mode and started again on the same data directory and
// port, and run under an environment of its own (LD_PRELOAD=libfaketime
// for a skewed clock). pgcluster starts throwaway clusters but cannot
// restart one, hence this; it finds the binaries and the OS user to run
// them as the way pgcluster does, with pgcluster's functions.
//
// Settings: fsync off (the suite kills processes, never the machine, so
// the kernel keeps what was written), synchronous_commit on (a commit
// acknowledged to a service is in the WAL the server replays after an
// immediate stop).
type Postgres struct {
	BinDir  string
	DataDir string
	LogPath string
	Port    int
	// Env is added to the server's environment at every start.
	Env []string

	cred *syscall.Credential
	dir  string
}

// NewPostgres initialises a cluster in a new directory under dir (which
// the postgres OS user must be able to enter) and returns it, stopped.
func NewPostgres(ctx context.Context, dir string) (*Postgres, error) {
	bin, err := pgcluster.FindBinDir("")
	if err != nil {
		return nil, err
	}
	port, err := freeaddr.Port()
	if err != nil {
		return nil, err
	}
	p := &Postgres{BinDir: bin, Port: port}
	p.cred, err = pgcluster.ServerCredential()
	if err != nil {
		return nil, err
	}
	p.dir, err = os.MkdirTemp(dir, "pg-")
	if err != nil {
		return nil, fmt.Errorf("create postgres dir: %w", err)
	}
	p.DataDir = filepath.Join(p.dir, "data")
	p.LogPath = filepath.Join(p.dir, "postgres.log")
	if err := pgcluster.GiveToServer(p.dir, p.cred); err != nil {
		return nil, err
	}
	if err := p.run(ctx, nil, "initdb", "-D", p.DataDir, "-U", "postgres", "-A", "trust", "-E", "UTF8",
		"--no-locale", "--no-instructions", "--no-sync"); err != nil {
		return nil, err
	}
	return p, nil
}

// URL is the URL of database db as the superuser.
func (p *Postgres) URL(db string) string {
	u := url.URL{Scheme: "postgres", User: url.User("postgres"), Host: "127.0.0.1:" + strconv.Itoa(p.Port),
		Path: "/" + db, RawQuery: "sslmode=disable"}
	return u.String()
}

// Start starts the server and waits until it accepts connections.
func (p *Postgres) Start(ctx context.Context) error {
	opts := fmt.Sprintf("-c listen_addresses=127.0.0.1 -c port=%d -c unix_socket_directories='' -c max_connections=300 "+
		"-c fsync=off -c synchronous_commit=on -c full_page_writes=off -c log_min_messages=warning", p.Port)
	if err := p.run(ctx, p.Env, "pg_ctl", "start", "-D", p.DataDir, "-l", p.LogPath, "-w", "-t", "120", "-o", opts); err != nil {
		return fmt.Errorf("%w\n%s", err, Tail(p.LogPath, 2000))
	}
	deadline := time.Now().Add(60 * time.Second)
	for {
		conn, err := pgx.Connect(ctx, p.URL("postgres"))
		if err == nil {
			conn.Close(ctx)
			return nil
		}
		if time.Now().After(deadline) || ctx.Err() != nil {
			return fmt.Errorf("postgres not accepting connections: %w", err)
		}
		time.Sleep(20 * time.Millisecond)
	}
}

// Stop stops the server: mode "fast" (roll back open transactions,
// checkpoint, exit) or "immediate" (quit at once; the next start replays
// the WAL, as after a crash).
func (p *Postgres) Stop(ctx context.Context, mode string) error {
	return p.run(ctx, nil, "pg_ctl", "stop", "-D", p.DataDir, "-m", mode, "-w", "-t", "60")
}

// Restart stops the server in mode, waits down for the given time, and
// starts it again.
func (p *Postgres) Restart(ctx context.Context, mode string, down time.Duration) error {
	if err := p.Stop(ctx, mode); err != nil {
		return err
	}
	select {
	case <-time.After(down):
	case <-ctx.Done():
		return ctx.Err()
	}
	return p.Start(ctx)
}

// Remove stops the server if it runs and deletes its directory.
func (p *Postgres) Remove(ctx context.Context) {
	_ = p.run(ctx, nil, "pg_ctl", "stop", "-D", p.DataDir, "-m", "immediate", "-w")
	_ = os.RemoveAll(p.dir)
}

// CreateDatabase creates an empty database.
func (p *Postgres) CreateDatabase(ctx context.Context, name string) error {
	conn, err := pgx.Connect(ctx, p.URL("postgres"))
	if err != nil {
		return fmt.Errorf("connect: %w", err)
	}
	defer conn.Close(ctx)
	if _, err := conn.Exec(ctx, "CREATE DATABASE "+pgx.Identifier{name}.Sanitize()); err != nil {
		return fmt.Errorf("create database %s: %w", name, err)
	}
	return nil
}

func (p *Postgres) run(ctx context.Context, env []string, name string, args ...string) error {
	cmd := exec.CommandContext(ctx, filepath.Join(p.BinDir, name), args...)
	var out bytes.Buffer
	cmd.Stdout, cmd.Stderr = &out, &out
	cmd.Env = append(pgcluster.ServerEnv(), env...)
	cmd.Dir = p.dir
	if p.cred != nil {
		cmd.SysProcAttr = &syscall.SysProcAttr{Credential: p.cred}
	}
	if err := cmd.Run(); err != nil {
		return fmt.Errorf("%s %s: %w: %s", name, strings.Join(args[:1], " "), err, strings.TrimSpace(out.String()))
	}
	return nil
}
