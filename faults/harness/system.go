package harness

import (
	"bytes"
	"context"
	"encoding/json"
	"io"
	"net/http"
	"os"
	"path/filepath"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/jackc/pgx/v5/pgxpool"
	"github.com/nats-io/nats.go"
	"github.com/nats-io/nats.go/jetstream"

	"github.com/retryd/retryd/internal/freeaddr"
)

// Service names, as processes are named.
const (
	Scheduler = "retryd-scheduler"
	Ingress   = "retryd-ingress"
	Triggers  = "retryd-triggers"
	Worker    = "faultworker"
)

// System is one retryd deployment under test: a nats-server process, a
// database, service processes, and the suite's own NATS connection and
// Postgres pool (used to drive load and to check invariants).
type System struct {
	T    testing.TB
	Ctx  context.Context
	Dir  string
	Bins *Binaries
	NATS *NATSServer
	// DatabaseURL is what the services connect with.
	DatabaseURL string
	NC          *nats.Conn
	JS          jetstream.JetStream
	Pool        *pgxpool.Pool
	// Wire counts what crosses the wire on the subjects that carry
	// effects, duplicates included.
	Wire *WireCounter

	procs   map[string]*Process
	addrs   map[string]string
	natsURL string
}

// Options configures NewSystem.
type Options struct {
	// DatabaseURL is a migrated, empty database for the services.
	DatabaseURL string
	// NATS adds to the generated nats-server config.
	NATS NATSConfig
	// NATSURL, when set, is a running NATS (e.g. a NATSCluster, a
	// comma-separated URL list) used instead of starting a nats-server
	// process; System.NATS is then nil.
	NATSURL string
}

// NewSystem builds the binaries (once per process), starts a nats-server
// and connects to it and to the database. Everything is stopped in
// t.Cleanup; process logs stay in Dir (kept when the test fails or
// RETRYD_FAULTS_KEEP is set).
func NewSystem(t testing.TB, ctx context.Context, opts Options) *System {
	t.Helper()
	bins, dir := start(t, ctx, "retryd-faults-")
	var err error
	s := &System{T: t, Ctx: ctx, Dir: dir, Bins: bins, DatabaseURL: opts.DatabaseURL,
		procs: map[string]*Process{}, addrs: map[string]string{}}
	t.Cleanup(func() {
		for _, p := range s.procs {
			_ = p.Thaw()
			_ = p.Kill9()
		}
		if s.NC != nil {
			s.NC.Close()
		}
		if s.Pool != nil {
			s.Pool.Close()
		}
		if s.NATS != nil {
			_ = s.NATS.Kill9()
		}
		keepOrRemove(t, dir, "logs")
	})
	s.natsURL = opts.NATSURL
	if s.natsURL == "" {
		s.NATS, err = NewNATSServer(bins, filepath.Join(dir, "nats"), opts.NATS)
		if err != nil {
			t.Fatalf("nats: %v", err)
		}
		if err := s.NATS.StartReady(ctx); err != nil {
			t.Fatalf("nats: %v", err)
		}
		s.natsURL = s.NATS.URL()
	}
	s.NC, err = nats.Connect(s.natsURL, nats.Name("faults"), nats.MaxReconnects(-1),
		nats.ReconnectWait(50*time.Millisecond), nats.ReconnectBufSize(64<<20))
	if err != nil {
		t.Fatalf("connect nats: %v", err)
	}
	s.JS, err = jetstream.New(s.NC, jetstream.WithPublishAsyncMaxPending(2048))
	if err != nil {
		t.Fatalf("jetstream: %v", err)
	}
	s.Wire = NewWireCounter(t, s.NC)
	if opts.DatabaseURL != "" {
		s.ConnectDB(opts.DatabaseURL)
	}
	return s
}

// ConnectDB opens the suite's pool on url (application_name faults, so the
// connection killer spares it).
func (s *System) ConnectDB(url string) {
	s.T.Helper()
	cfg, err := pgxpool.ParseConfig(url)
	if err != nil {
		s.T.Fatalf("parse database url: %v", err)
	}
	cfg.ConnConfig.RuntimeParams["application_name"] = "faults"
	cfg.MaxConns = 8
	s.Pool, err = pgxpool.NewWithConfig(s.Ctx, cfg)
	if err != nil {
		s.T.Fatalf("open pool: %v", err)
	}
	s.DatabaseURL = url
}

// AdminToken is the bootstrap admin API token every service of the suite
// starts with (RETRYD_ADMIN_TOKEN) and Do sends: the APIs check tokens.
const AdminToken = "rtd_faults-admin-token-0123456789abcdefghijklmnop"

// serviceEnv holds the settings that make the services recover quickly
// in tests: short ack waits (a killed process's messages come back after
// seconds, not 30 s), frequent reconciliation and relay polls. Every value
// is within what the services validate. The scheduler runs its default
// ack wait (2 s): its recovery after a kill is what the suite checks.
var serviceEnv = map[string][]string{
	Scheduler: {
		"RETRYD_MIGRATE=true",
		"RETRYD_SCHEDULER_MAX_IDLE=200ms",
		"RETRYD_SCHEDULER_RECONCILE_INTERVAL=1s",
		"RETRYD_SCHEDULER_RELAY_INTERVAL=200ms",
		"RETRYD_SCHEDULER_METRICS_INTERVAL=1s",
		"RETRYD_SCHEDULER_SHUTDOWN_TIMEOUT=10s",
	},
	Ingress: {
		"RETRYD_INGRESS_ACK_WAIT=3s",
		"RETRYD_INGRESS_RECONCILE_INTERVAL=1s",
		"RETRYD_INGRESS_SHUTDOWN_TIMEOUT=10s",
	},
	Triggers: {
		"RETRYD_TRIGGERS_ACK_WAIT=3s",
		"RETRYD_TRIGGERS_NAK_DELAY=200ms",
		"RETRYD_TRIGGERS_RELAY_INTERVAL=200ms",
		"RETRYD_TRIGGERS_RECONCILE_INTERVAL=1s",
		"RETRYD_TRIGGERS_SHUTDOWN_TIMEOUT=10s",
	},
	Worker: {
		"FAULTWORKER_ACK_WAIT=3s",
	},
}

// Service returns the process of a service instance, creating (not
// starting) it on first use. name is Scheduler, Ingress, Triggers or
// Worker, optionally with a suffix ("retryd-scheduler-2") for a second
// instance; env is added after the defaults.
func (s *System) Service(name string, env ...string) *Process {
	s.T.Helper()
	if p, ok := s.procs[name]; ok {
		return p
	}
	base := name
	for _, b := range []string{Scheduler, Ingress, Triggers, Worker} {
		if strings.HasPrefix(name, b) {
			base = b
		}
	}
	port, err := freeaddr.Port()
	if err != nil {
		s.T.Fatalf("port: %v", err)
	}
	addr := "127.0.0.1:" + strconv.Itoa(port)
	full := []string{
		"NATS_URL=" + s.natsURL,
		"DATABASE_URL=" + s.DatabaseURL,
		"RETRYD_HTTP_ADDR=" + addr,
		"RETRYD_LOG_LEVEL=" + envOr("RETRYD_FAULTS_LOG_LEVEL", "info"),
		"RETRYD_SCHEDULER_INSTANCE=" + name,
		// Every service ensures the same bootstrap admin token (idempotent);
		// Do sends it, so the scenarios act as an admin.
		"RETRYD_ADMIN_TOKEN=" + AdminToken,
	}
	full = append(full, serviceEnv[base]...)
	full = append(full, env...)
	p := &Process{
		Name: name, Bin: s.Bins.Path(base), Env: full,
		LogPath:  filepath.Join(s.Dir, name+".log"),
		ReadyURL: "http://" + addr + "/readyz",
	}
	s.procs[name] = p
	s.addrs[name] = addr
	return p
}

// Start starts a service (see Service) and waits until it is ready.
func (s *System) Start(name string, env ...string) *Process {
	s.T.Helper()
	p := s.Service(name, env...)
	ctx, cancel := context.WithTimeout(s.Ctx, 90*time.Second)
	defer cancel()
	if err := p.StartReady(ctx); err != nil {
		s.T.Fatalf("start %s: %v", name, err)
	}
	return p
}

// Restart starts a service that exited (or was killed) again and waits
// until it is ready; it does not stop a running one.
func (s *System) Restart(name string) {
	s.T.Helper()
	p := s.procs[name]
	ctx, cancel := context.WithTimeout(s.Ctx, 90*time.Second)
	defer cancel()
	if err := p.StartReady(ctx); err != nil {
		s.T.Fatalf("restart %s: %v", name, err)
	}
}

// URL is the base URL of a service's HTTP server.
func (s *System) URL(name string) string { return "http://" + s.addrs[name] }

// Processes lists the service processes started so far.
func (s *System) Processes() []*Process {
	out := make([]*Process, 0, len(s.procs))
	for _, p := range s.procs {
		out = append(out, p)
	}
	return out
}

// Do sends an HTTP request with a JSON body (nil for none) and returns
// the status and body.
func (s *System) Do(method, url string, body any) (int, []byte, error) {
	var rd io.Reader
	switch b := body.(type) {
	case nil:
	case []byte:
		rd = bytes.NewReader(b)
	case string:
		rd = strings.NewReader(b)
	default:
		raw, err := json.Marshal(b)
		if err != nil {
			return 0, nil, err
		}
		rd = bytes.NewReader(raw)
	}
	ctx, cancel := context.WithTimeout(s.Ctx, 30*time.Second)
	defer cancel()
	req, err := http.NewRequestWithContext(ctx, method, url, rd)
	if err != nil {
		return 0, nil, err
	}
	req.Header.Set("Content-Type", "application/json")
	req.Header.Set("Authorization", "Bearer "+AdminToken)
	resp, err := http.DefaultClient.Do(req)
	if err != nil {
		return 0, nil, err
	}
	defer resp.Body.Close()
	out, err := io.ReadAll(resp.Body)
	return resp.StatusCode, out, err
}

// MustDo is Do that fails the test unless the status is one of want.
func (s *System) MustDo(method, url string, body any, want ...int) []byte {
	s.T.Helper()
	status, out, err := s.Do(method, url, body)
	if err != nil {
		s.T.Fatalf("%s %s: %v", method, url, err)
	}
	for _, w := range want {
		if status == w {
			return out
		}
	}
	s.T.Fatalf("%s %s: status %d, want %v: %s", method, url, status, want, out)
	return nil
}

// Policy sets the retry policy of a kind (job type "_" is the kind's
// default) through the scheduler's API.
func (s *System) Policy(kind, jobType string, p map[string]any) {
	s.T.Helper()
	if jobType == "" {
		jobType = "_"
	}
	s.MustDo(http.MethodPut, s.URL(Scheduler)+"/v1/policies/"+kind+"/"+jobType, p, http.StatusOK, http.StatusCreated)
}

// Eventually polls cond every interval until it returns true or timeout
// passes; it returns how long it took and whether cond held.
func Eventually(ctx context.Context, timeout, interval time.Duration, cond func() bool) (time.Duration, bool) {
	start := time.Now()
	deadline := start.Add(timeout)
	for {
		if cond() {
			return time.Since(start), true
		}
		if time.Now().After(deadline) || ctx.Err() != nil {
			return time.Since(start), false
		}
		time.Sleep(interval)
	}
}

// LogsContain reports which of the service logs contain needle.
func (s *System) LogsContain(needle string) []string {
	var hits []string
	for name, p := range s.procs {
		b, err := os.ReadFile(p.LogPath)
		if err == nil && bytes.Contains(b, []byte(needle)) {
			hits = append(hits, name)
		}
	}
	return hits
}

// Panics lists the processes whose log shows a Go panic.
func (s *System) Panics() []string {
	var out []string
	for _, needle := range []string{"panic:", "goroutine 1 [", "fatal error:"} {
		out = append(out, s.LogsContain(needle)...)
	}
	return out
}

func envOr(name, def string) string {
	if v := os.Getenv(name); v != "" {
		return v
	}
	return def
}

// start builds the binaries (once per process) and makes the test's
// directory, named by prefix and the test.
func start(t testing.TB, ctx context.Context, prefix string) (*Binaries, string) {
	t.Helper()
	bins, err := Build(ctx)
	if err != nil {
		t.Fatalf("build: %v", err)
	}
	dir, err := os.MkdirTemp("", prefix+sanitize(t.Name())+"-")
	if err != nil {
		t.Fatalf("temp dir: %v", err)
	}
	return bins, dir
}

// keepOrRemove, last in a test's cleanup, keeps dir when the test failed
// or RETRYD_FAULTS_KEEP is set (logging where), and removes it otherwise.
func keepOrRemove(t testing.TB, dir, what string) {
	if t.Failed() || os.Getenv("RETRYD_FAULTS_KEEP") != "" {
		t.Logf("%s kept in %s", what, dir)
		return
	}
	_ = os.RemoveAll(dir)
}

func sanitize(name string) string {
	return strings.Map(func(r rune) rune {
		if r >= 'a' && r <= 'z' || r >= 'A' && r <= 'Z' || r >= '0' && r <= '9' {
			return r
		}
		return '-'
	}, name)
}
