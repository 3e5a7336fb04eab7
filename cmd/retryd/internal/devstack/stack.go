// Package devstack runs all of retryd in one process: an embedded NATS
// server with JetStream on disk, a local Postgres (or DATABASE_URL), the
// schema and streams, the scheduler, ingress, triggers, the jobs
// projection and API, a worker with the due router, and one HTTP server
// for every API, the dashboard, health and metrics. `retryd dev` and the
// CLI's tests use it.
package devstack

import (
	"context"
	"errors"
	"fmt"
	"github.com/retryd/retryd/internal/auth"
	"log/slog"
	"net"
	"os"
	"path/filepath"
	"sync"
	"sync/atomic"
	"time"

	"github.com/jackc/pgx/v5/pgxpool"
	"github.com/nats-io/nats-server/v2/server"
	"github.com/nats-io/nats.go"
	"github.com/nats-io/nats.go/jetstream"
	"github.com/prometheus/client_golang/prometheus"
	"github.com/rs/zerolog"
	slogzerolog "github.com/samber/slog-zerolog/v2"

	"github.com/retryd/retryd/internal/backends"
	"github.com/retryd/retryd/internal/serve"
	"github.com/retryd/retryd/internal/streams"
	"github.com/retryd/retryd/internal/telemetry"
	"github.com/retryd/retryd/migrations"
	"github.com/retryd/retryd/migrations/pgcluster"
	"github.com/retryd/retryd/pkg/worker"
	"github.com/retryd/retryd/services/ingress"
	"github.com/retryd/retryd/services/jobs"
	"github.com/retryd/retryd/services/scheduler"
	"github.com/retryd/retryd/services/triggers"
)

// Stack is retryd in one process. Build it with New, run it with Start,
// stop it with Stop.
type Stack struct {
	cfg    Config
	log    zerolog.Logger
	tokens *auth.Store

	// Set by Start.
	NATS      *server.Server
	NC        *nats.Conn
	JS        jetstream.JetStream
	Pool      *pgxpool.Pool
	Registry  *prometheus.Registry
	Health    *serve.Health
	Scheduler *scheduler.Scheduler
	Ingress   *ingress.Service
	Triggers  *triggers.Service
	Projector *jobs.Projector
	JobsAPI   *jobs.API
	Worker    *worker.Worker

	databaseURL string
	localPG     bool
	pgDir       string
	httpAddr    net.Addr

	mu       sync.Mutex
	started  bool
	stopped  bool
	stopErr  error
	shutdown []step // undone in reverse order by Stop
}

// step is one thing Stop undoes.
type step struct {
	name string
	fn   func(ctx context.Context) error
}

// New validates cfg; it does no I/O.
func New(cfg Config) (*Stack, error) {
	if err := cfg.validate(); err != nil {
		return nil, fmt.Errorf("dev stack: %w", err)
	}
	return &Stack{cfg: cfg, log: cfg.Logger}, nil
}

func (s *Stack) onStop(name string, fn func(ctx context.Context) error) {
	s.shutdown = append(s.shutdown, step{name: name, fn: fn})
}

// Start brings everything up in dependency order. On error, what started
// is stopped again.
func (s *Stack) Start(ctx context.Context) (err error) {
	s.mu.Lock()
	defer s.mu.Unlock()
	if s.started || s.stopped {
		return errors.New("dev stack: already started")
	}
	s.started = true
	defer func() {
		if err != nil {
			_ = s.stopLocked(context.WithoutCancel(ctx))
		}
	}()
	if err := os.MkdirAll(s.cfg.DataDir, 0o755); err != nil {
		return fmt.Errorf("create data directory: %w", err)
	}
	if err := s.startTracing(ctx); err != nil {
		return err
	}
	if err := s.startNATS(); err != nil {
		return err
	}
	if err := s.startPostgres(ctx); err != nil {
		return err
	}
	if err := migrations.Up(ctx, s.databaseURL, s.log.With().Str("component", "migrations").Logger()); err != nil {
		return fmt.Errorf("migrate: %w", err)
	}
	if err := s.startMaintenance(ctx); err != nil {
		return err
	}
	if err := s.connect(ctx); err != nil {
		return err
	}
	if err := streams.Ensure(ctx, s.JS, streams.Options{}); err != nil {
		return fmt.Errorf("ensure streams: %w", err)
	}
	s.Registry = serve.NewRegistry()
	s.Health = &serve.Health{}
	if err := s.startServices(ctx); err != nil {
		return err
	}
	if err := s.startHTTP(ctx); err != nil {
		return err
	}
	// Registered last, so undone first: /readyz answers 503 before anything
	// stops.
	probeCtx, stopProbes := context.WithCancel(context.WithoutCancel(ctx))
	go s.Health.Watch(probeCtx, serve.DefaultProbeInterval, backends.Checks(s.Pool, s.NC)...)
	s.onStop("readiness", func(context.Context) error { s.Health.SetReady(false); stopProbes(); return nil })
	s.Health.SetReady(true)
	s.log.Info().Str("http", s.URL()).Str("nats", s.NATSURL()).Msg("retryd dev stack started")
	return nil
}

// tracingInstalled is set while a stack of this process owns the global
// tracer provider: the first stack installs it (when OTEL_EXPORTER_OTLP_*
// asks for it) and flushes it when it stops; stacks started meanwhile
// (tests) share it.
var tracingInstalled atomic.Bool

func (s *Stack) startTracing(ctx context.Context) error {
	if !telemetry.Enabled() || !tracingInstalled.CompareAndSwap(false, true) {
		return nil
	}
	shutdown, err := telemetry.Setup(ctx, "retryd", s.log)
	if err != nil {
		tracingInstalled.Store(false)
		return fmt.Errorf("set up tracing: %w", err)
	}
	s.onStop("tracing", func(ctx context.Context) error {
		defer tracingInstalled.Store(false)
		return shutdown(ctx)
	})
	return nil
}

func (s *Stack) startNATS() error {
	dir, err := filepath.Abs(filepath.Join(s.cfg.DataDir, "nats"))
	if err != nil {
		return fmt.Errorf("resolve NATS store directory: %w", err)
	}
	opts := &server.Options{
		ServerName:         "retryd-dev",
		Host:               s.cfg.NATSHost,
		Port:               s.cfg.NATSPort,
		JetStream:          true,
		StoreDir:           dir,
		SyncAlways:         s.cfg.NATSSyncAlways,
		SyncInterval:       s.cfg.NATSSyncInterval,
		NoSigs:             true,
		JetStreamMaxMemory: 256 << 20,
		// The streams reserve their max_bytes (10 GiB together,
		// streams.DefaultMaxBytes) against this cap; left to the free
		// disk (75% of it), a laptop with less than 14 GiB free could
		// not create them. It is a cap, not an allocation.
		JetStreamMaxStore: 16 << 30,
	}
	srv, err := server.NewServer(opts)
	if err != nil {
		return fmt.Errorf("configure embedded NATS: %w", err)
	}
	srv.SetLoggerV2(natsLogger{s.log.With().Str("component", "nats-server").Logger()}, false, false, false)
	go srv.Start()
	if !srv.ReadyForConnections(15 * time.Second) {
		srv.Shutdown()
		return fmt.Errorf("embedded NATS did not start on %s:%d (is the port taken? use --nats-port)", s.cfg.NATSHost, s.cfg.NATSPort)
	}
	s.NATS = srv
	s.onStop("nats server", func(context.Context) error {
		srv.Shutdown()
		srv.WaitForShutdown()
		return nil
	})
	return nil
}

func (s *Stack) startPostgres(ctx context.Context) error {
	if s.cfg.DatabaseURL != "" {
		s.databaseURL = s.cfg.DatabaseURL
		return nil
	}
	dir, note, err := postgresDir(s.cfg.DataDir)
	if err != nil {
		return err
	}
	if note != "" {
		s.log.Warn().Str("dir", dir).Msg(note)
	}
	cluster, err := pgcluster.Start(ctx, pgcluster.Options{DataDir: dir, Log: s.cfg.PostgresLog, BinDir: s.cfg.PostgresBinDir})
	if errors.Is(err, pgcluster.ErrNoPostgres) {
		return fmt.Errorf("no DATABASE_URL, and no local Postgres to start: %w\n"+
			"  with a server of your own: DATABASE_URL=postgres://user@host/db go run ./cmd/retryd dev", err)
	}
	if err != nil {
		return fmt.Errorf("start local Postgres in %s: %w", dir, err)
	}
	s.localPG, s.pgDir = true, cluster.DataDir()
	s.databaseURL = cluster.URL("postgres")
	s.onStop("postgres", cluster.Stop)
	return nil
}

func (s *Stack) connect(ctx context.Context) error {
	pcfg, err := pgxpool.ParseConfig(s.databaseURL)
	if err != nil {
		return fmt.Errorf("parse database URL: %w", err)
	}
	pcfg.MaxConns = int32(s.cfg.PoolConns)
	pool, err := pgxpool.NewWithConfig(ctx, pcfg)
	if err != nil {
		return fmt.Errorf("open database: %w", err)
	}
	s.Pool = pool
	s.onStop("postgres pool", func(context.Context) error { pool.Close(); return nil })

	nc, err := nats.Connect(s.NATS.ClientURL(), nats.Name("retryd-dev"), nats.MaxReconnects(-1))
	if err != nil {
		return fmt.Errorf("connect to embedded NATS: %w", err)
	}
	js, err := jetstream.New(nc)
	if err != nil {
		nc.Close()
		return fmt.Errorf("jetstream: %w", err)
	}
	s.NC, s.JS = nc, js
	s.onStop("nats connection", func(context.Context) error {
		if err := nc.Drain(); err != nil {
			nc.Close()
		}
		for i := 0; i < 100 && !nc.IsClosed(); i++ {
			time.Sleep(10 * time.Millisecond)
		}
		return nil
	})
	return nil
}

func (s *Stack) startServices(ctx context.Context) error {
	lg := func(name string) zerolog.Logger { return s.log.With().Str("service", name).Logger() }
	reg := s.Registry

	sched, err := scheduler.New(scheduler.Config{Pool: s.Pool, JS: s.JS, Logger: lg("scheduler"), Registerer: reg,
		MaxIdle: s.cfg.SchedulerMaxIdle})
	if err = s.start(ctx, "scheduler", sched, err); err != nil {
		return err
	}
	s.Scheduler = sched

	ing, err := ingress.New(ingress.Config{Pool: s.Pool, JS: s.JS, Logger: lg("ingress"), Registerer: reg,
		IntakeRate: s.cfg.IntakeRate, IntakeBurst: s.cfg.IntakeBurst})
	if err = s.start(ctx, "ingress", ing, err); err != nil {
		return err
	}
	s.Ingress = ing

	trig, err := triggers.New(triggers.Config{Pool: s.Pool, JS: s.JS, Logger: lg("triggers"), Registerer: reg})
	if err = s.start(ctx, "triggers", trig, err); err != nil {
		return err
	}
	s.Triggers = trig

	proj, err := jobs.NewProjector(jobs.ProjectorConfig{Pool: s.Pool, JS: s.JS, Logger: lg("jobs-projection"),
		Registerer: reg, FetchWait: s.cfg.FetchWait})
	if err = s.start(ctx, "jobs projection", proj, err); err != nil {
		return err
	}
	s.Projector = proj

	api, err := jobs.NewAPI(jobs.APIConfig{Pool: s.Pool, Retry: scheduler.RetryController{S: sched}, JS: s.JS, Logger: lg("jobs-api"), Registerer: reg})
	if err = s.start(ctx, "jobs API", api, err); err != nil {
		return err
	}
	s.JobsAPI = api

	w, err := worker.New(worker.Config{JS: s.JS, Logger: slogger(lg("worker")), Registerer: reg, Source: "retryd/dev-worker",
		Concurrency: s.cfg.WorkerConcurrency, FetchWait: s.cfg.FetchWait})
	if err != nil {
		return fmt.Errorf("new worker: %w", err)
	}
	for jobType, h := range s.cfg.Handlers {
		if err := w.Handle(jobType, h); err != nil {
			return err
		}
	}
	if err := s.start(ctx, "worker", w, nil); err != nil {
		return err
	}
	s.Worker = w
	return nil
}

// service is what the stack starts and stops alike.
type service interface {
	Start(ctx context.Context) error
	Stop(ctx context.Context) error
}

// start starts svc, which its constructor returned with newErr, and has
// the stack stop it; name says which service in errors.
func (s *Stack) start(ctx context.Context, name string, svc service, newErr error) error {
	if newErr != nil {
		return fmt.Errorf("new %s: %w", name, newErr)
	}
	if err := svc.Start(ctx); err != nil {
		return fmt.Errorf("start %s: %w", name, err)
	}
	s.onStop(name, svc.Stop)
	return nil
}

func (s *Stack) startHTTP(ctx context.Context) error {
	if s.cfg.Auth.Mode == auth.ModeTokens && s.cfg.Auth.AdminToken == "" {
		// Someone must be able to sign in: a fresh admin token per start,
		// shown by retryd dev (the previous one is revoked).
		secret, err := auth.NewSecret()
		if err != nil {
			return err
		}
		s.cfg.Auth.AdminToken = secret
	}
	guard, tokens, err := s.cfg.Auth.Guard(ctx, s.Pool, s.log.With().Str("component", "auth").Logger(), s.cfg.HTTPAddr)
	if err != nil {
		return err
	}
	s.tokens = tokens
	tlsCfg, err := s.cfg.TLS.Server()
	if err != nil {
		return err
	}
	ln, err := net.Listen("tcp", s.cfg.HTTPAddr)
	if err != nil {
		return fmt.Errorf("listen on %s (is it taken? use --http): %w", s.cfg.HTTPAddr, err)
	}
	s.httpAddr = ln.Addr()
	srv := serve.NewServer("", telemetry.Handler(guard.Handler(s.routes()), "retryd"))
	srv.TLSConfig = tlsCfg
	ctx, cancel := context.WithCancel(context.Background())
	done := make(chan error, 1)
	go func() { done <- serve.Serve(ctx, srv, ln, s.log.With().Str("component", "http").Logger()) }()
	s.onStop("http server", func(context.Context) error {
		cancel()
		return <-done
	})
	return nil
}

// Stop stops everything in reverse order: readiness off, the HTTP server,
// the consumers (drained), then the connections, NATS and Postgres. It is
// idempotent.
func (s *Stack) Stop(ctx context.Context) error {
	s.mu.Lock()
	defer s.mu.Unlock()
	if s.stopped {
		return s.stopErr
	}
	return s.stopLocked(ctx)
}

func (s *Stack) stopLocked(ctx context.Context) error {
	s.stopped = true
	var errs []error
	// Undo in reverse: readiness off, HTTP, the consumers (drained), the
	// connections, then NATS and Postgres.
	order := make([]step, 0, len(s.shutdown))
	for i := len(s.shutdown) - 1; i >= 0; i-- {
		order = append(order, s.shutdown[i])
	}
	for _, st := range order {
		if err := st.fn(ctx); err != nil {
			errs = append(errs, fmt.Errorf("stop %s: %w", st.name, err))
		}
	}
	s.shutdown = nil
	s.stopErr = errors.Join(errs...)
	return s.stopErr
}

// AdminToken is the admin token of a stack with tokens on (the one given
// in Config.Auth or the one it made), empty with authentication off.
func (s *Stack) AdminToken() string {
	if s.cfg.Auth.Mode != auth.ModeTokens {
		return ""
	}
	return s.cfg.Auth.AdminToken
}

// URL is the base URL of the HTTP server, e.g. http://127.0.0.1:8080
// (https:// with TLS).
func (s *Stack) URL() string {
	if s.httpAddr == nil {
		return ""
	}
	return s.cfg.TLS.Scheme() + "://" + displayAddr(s.httpAddr)
}

// NATSURL is the client URL of the embedded NATS server.
func (s *Stack) NATSURL() string {
	if s.NATS == nil {
		return ""
	}
	return s.NATS.ClientURL()
}

// DatabaseURL is the Postgres URL in use.
func (s *Stack) DatabaseURL() string { return s.databaseURL }

// LocalPostgres reports whether the stack started its own Postgres, and
// where its data directory is.
func (s *Stack) LocalPostgres() (bool, string) { return s.localPG, s.pgDir }

// displayAddr turns a wildcard listen address into one a browser can open.
func displayAddr(a net.Addr) string {
	tcp, ok := a.(*net.TCPAddr)
	if !ok {
		return a.String()
	}
	if tcp.IP == nil || tcp.IP.IsUnspecified() {
		return net.JoinHostPort("127.0.0.1", fmt.Sprint(tcp.Port))
	}
	return tcp.String()
}

// slogger hands l to the worker SDK, which logs through log/slog: its
// records keep l's fields, level and timestamps and go where the rest of
// the stack's logs go.
func slogger(l zerolog.Logger) *slog.Logger {
	return slog.New(slogzerolog.Option{Logger: &l, Level: slogzerolog.ZeroLogLeveler{Logger: &l}, NoTimestamp: true}.NewZerologHandler())
}
