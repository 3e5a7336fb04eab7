// Command retryd-scheduler runs retryd's scheduler: retry decisions, the
// Postgres retry projection, due events, reconciliation and the operator
// API.
//
// Usage:
//
//	retryd-scheduler            run the scheduler (serve)
//	retryd-scheduler rebuild    replay RETRIES into an empty projection, print the counts as JSON
//
// Configuration is read from the environment:
//
//	DATABASE_URL                           Postgres URL (required)
//	NATS_URL, NATS_CREDS, NATS_NKEY,       NATS connection (see internal/natsconn)
//	NATS_USER, NATS_PASSWORD, NATS_TOKEN,
//	NATS_TLS_CERT, NATS_TLS_KEY, NATS_TLS_CA
//	RETRYD_HTTP_ADDR                       listen address (default :8080)
//	RETRYD_HTTP_TLS_CERT, RETRYD_HTTP_TLS_KEY  PEM certificate and key: serve HTTPS (both or neither)
//	RETRYD_MIGRATE                         apply migrations at start (default false)
//	RETRYD_LOG_LEVEL                       debug, info (default), warn, error
//	RETRYD_SCHEDULER_INSTANCE              instance name in logs (default host-pid)
//	RETRYD_SCHEDULER_BATCH_SIZE            due events per transaction (default 1000)
//	RETRYD_SCHEDULER_EMITTERS              due transactions at once during a backlog (default 4)
//	RETRYD_SCHEDULER_CONSUME_BATCH         lifecycle messages per transaction (default 500)
//	RETRYD_SCHEDULER_MAX_ACK_PENDING       unacked messages of the consumer, all instances (default 5000)
//	RETRYD_SCHEDULER_RELEASE_PART          held rows a release applies per transaction (default 1000)
//	RETRYD_SCHEDULER_ACK_WAIT              consumer ack wait: a killed instance's facts are redelivered after it (default 2s)
//	RETRYD_SCHEDULER_MAX_IDLE              longest sleep of the due loop (default 1s)
//	RETRYD_SCHEDULER_REDUE_AFTER           re-emit an unresolved due after this plus the policy stage's lag (default 5m, > 2m)
//	RETRYD_SCHEDULER_RECONCILE_INTERVAL    streams/consumer/outbox check (default 30s)
//	RETRYD_SCHEDULER_METRICS_INTERVAL      pending gauges refresh (default 15s)
//	RETRYD_SCHEDULER_RELAY_INTERVAL        outbox relay poll (default 1s;
//	                                       RETRYD_SCHEDULER_OUTBOX_INTERVAL, its old name, still works)
//	RETRYD_SCHEDULER_INBOX_RETENTION       prune applied message ids older than (default 168h; negative disables)
//	RETRYD_SCHEDULER_LOCK_TIMEOUT          longest wait for a row lock held by another instance (default 5s)
//	RETRYD_SCHEDULER_STREAM_REPLICAS       stream replicas (unset: 1 for a new stream, an existing one keeps its own)
//	RETRYD_STREAM_<NAME>_MAX_BYTES         max_bytes of a stream it creates, e.g. RETRYD_STREAM_RETRIES_MAX_BYTES=8GiB
//	RETRYD_STREAM_<NAME>_MAX_AGE           max_age of a stream it creates, e.g. 720h (docs/contract.md has the defaults)
//	RETRYD_SHARDS                          scheduler shards RETRIES is split into, each its own database (default 1; docs/shards.md)
//	RETRYD_SHARD                           the shard this scheduler owns, 0 to RETRYD_SHARDS-1 (default 0)
//	RETRYD_AUTH_DATABASE_URL               Postgres URL of the database holding the API tokens, when not DATABASE_URL:
//	                                       a shard's scheduler (RETRYD_SHARD > 0) checks tokens in the home shard's
//	                                       database (docs/shards.md)
//	RETRYD_SHARD_DATABASE_URLS             home shard with RETRYD_JOBS: the databases of shards 1 to RETRYD_SHARDS-1,
//	                                       comma-separated, where the jobs API retries and cancels their jobs
//	RETRYD_SCHEDULER_ERROR_PATTERNS        extra classifier patterns, JSON {"rate_limit": ["(?i)slow down"]}
//	RETRYD_SCHEDULER_SHUTDOWN_TIMEOUT      bound on the graceful stop (default 30s)
//	RETRYD_JOBS                            host the jobs projection and the jobs/analytics API (default true on shard 0)
//	RETRYD_DASHBOARD                       serve the web dashboard at /ui/ (default true on shard 0)
package main

import (
	"context"
	"crypto/tls"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"net/http"
	"os"
	"strings"
	"time"

	"github.com/jackc/pgx/v5/pgxpool"
	"github.com/nats-io/nats.go/jetstream"
	"github.com/prometheus/client_golang/prometheus"
	"github.com/rs/zerolog"

	"github.com/retryd/retryd/internal/auth"
	"github.com/retryd/retryd/internal/backends"
	"github.com/retryd/retryd/internal/daemon"
	"github.com/retryd/retryd/internal/dashboard"
	"github.com/retryd/retryd/internal/envvar"
	"github.com/retryd/retryd/internal/natsconn"
	"github.com/retryd/retryd/internal/serve"
	"github.com/retryd/retryd/internal/telemetry"
	"github.com/retryd/retryd/migrations"
	"github.com/retryd/retryd/pkg/errclass"
	"github.com/retryd/retryd/services/jobs"
	"github.com/retryd/retryd/services/scheduler"
)

const usage = `usage: retryd-scheduler [serve|rebuild]

  serve     run the scheduler (default)
  rebuild   replay the RETRIES stream into an empty retry projection

Configuration comes from the environment; see the package documentation
or docs/scheduler.md.
`

func main() {
	log := daemon.Logger("retryd-scheduler")
	cmd := "serve"
	if len(os.Args) > 1 {
		cmd = os.Args[1]
	}
	ctx, stop := serve.SignalContext()
	defer stop()
	var err error
	switch cmd {
	case "serve":
		err = serveCmd(ctx, log)
	case "rebuild":
		err = rebuildCmd(ctx, log, os.Stdout)
	case "help", "-h", "--help":
		fmt.Print(usage)
		return
	default:
		fmt.Fprint(os.Stderr, usage)
		os.Exit(2)
	}
	if err != nil {
		log.Error().Err(err).Str("command", cmd).Msg("retryd-scheduler failed")
		stop()
		os.Exit(1)
	}
}

// settings is the environment, parsed.
type settings struct {
	dbURL           string
	authDBURL       string   // "": tokens are in dbURL
	shardDBURLs     []string // shards 1..n-1, for the home shard's jobs API
	addr            string
	migrate         bool
	jobs            bool
	dashboard       bool
	shutdownTimeout time.Duration
	auth            auth.Config
	tls             *tls.Config // nil: plain HTTP
	cfg             scheduler.Config
}

func readSettings(log zerolog.Logger) (settings, error) {
	e := &envvar.Reader{}
	e.Renamed("RETRYD_SCHEDULER_RELAY_INTERVAL", "RETRYD_SCHEDULER_OUTBOX_INTERVAL")
	// The jobs API and the dashboard live on the home shard (0): the jobs
	// projection is one for the whole deployment.
	home := e.Int("RETRYD_SHARD") == 0
	s := settings{
		addr:            envvar.String("RETRYD_HTTP_ADDR", ":8080"),
		migrate:         e.Bool("RETRYD_MIGRATE", false),
		jobs:            e.Bool("RETRYD_JOBS", home),
		dashboard:       e.Bool("RETRYD_DASHBOARD", home),
		shutdownTimeout: e.Duration("RETRYD_SCHEDULER_SHUTDOWN_TIMEOUT", 30*time.Second),
		cfg: scheduler.Config{
			Logger:            log,
			Instance:          os.Getenv("RETRYD_SCHEDULER_INSTANCE"),
			BatchSize:         e.Int("RETRYD_SCHEDULER_BATCH_SIZE"),
			Emitters:          e.Int("RETRYD_SCHEDULER_EMITTERS"),
			ConsumeBatch:      e.Int("RETRYD_SCHEDULER_CONSUME_BATCH"),
			MaxAckPending:     e.Int("RETRYD_SCHEDULER_MAX_ACK_PENDING"),
			ReleasePart:       e.Int("RETRYD_SCHEDULER_RELEASE_PART"),
			AckWait:           e.Duration("RETRYD_SCHEDULER_ACK_WAIT", 0),
			MaxIdle:           e.Duration("RETRYD_SCHEDULER_MAX_IDLE", 0),
			RedueAfter:        e.Duration("RETRYD_SCHEDULER_REDUE_AFTER", 0),
			ReconcileInterval: e.Duration("RETRYD_SCHEDULER_RECONCILE_INTERVAL", 0),
			MetricsInterval:   e.Duration("RETRYD_SCHEDULER_METRICS_INTERVAL", 0),
			RelayInterval:     e.Duration("RETRYD_SCHEDULER_RELAY_INTERVAL", 0),
			InboxRetention:    e.Duration("RETRYD_SCHEDULER_INBOX_RETENTION", 0),
			LockTimeout:       e.Duration("RETRYD_SCHEDULER_LOCK_TIMEOUT", 0),
		},
	}
	env := daemon.ReadEnv(e, s.addr)
	s.cfg.Streams = env.Streams
	s.cfg.Streams.Replicas = e.Int("RETRYD_SCHEDULER_STREAM_REPLICAS")
	s.cfg.Shards, s.cfg.Shard = s.cfg.Streams.Shards, e.Int("RETRYD_SHARD")
	s.dbURL, s.auth, s.tls = env.DatabaseURL, env.Auth, env.TLS
	s.authDBURL = os.Getenv("RETRYD_AUTH_DATABASE_URL")
	if v := os.Getenv("RETRYD_SHARD_DATABASE_URLS"); v != "" {
		s.shardDBURLs = strings.Split(v, ",")
	}
	e.Add(checkShardJobs(s))
	if v := os.Getenv("RETRYD_SCHEDULER_ERROR_PATTERNS"); v != "" {
		var patterns map[errclass.Class][]string
		if err := json.Unmarshal([]byte(v), &patterns); err != nil {
			e.Add(fmt.Errorf(`RETRYD_SCHEDULER_ERROR_PATTERNS must be JSON like {"rate_limit": ["regexp"]}: %w`, err))
		} else if c, err := errclass.NewClassifier(patterns); err != nil {
			e.Add(fmt.Errorf("RETRYD_SCHEDULER_ERROR_PATTERNS: %w", err))
		} else {
			s.cfg.Classifier = c
		}
	}
	for _, d := range e.Deprecations() {
		log.Warn().Msg(d)
	}
	return s, e.Err()
}

// checkShardJobs refuses the jobs API where it cannot act on every job:
// on a shard other than the home one (a second jobs projection), and on
// the home shard of a split deployment without the other shards'
// databases (its retries and cancels would miss their jobs).
func checkShardJobs(s settings) error {
	n := max(s.cfg.Shards, 1)
	switch {
	case s.jobs && s.cfg.Shard > 0:
		return fmt.Errorf("RETRYD_JOBS=true on shard %d: the jobs projection and API run on the home shard (0) only; unset it", s.cfg.Shard)
	case s.jobs && n > 1 && len(s.shardDBURLs) != n-1:
		return fmt.Errorf("RETRYD_SHARD_DATABASE_URLS names %d databases for RETRYD_SHARDS=%d: the home shard's jobs API retries and cancels jobs on every shard, so give the databases of shards 1 to %d, comma-separated, in shard order (or RETRYD_JOBS=false)",
			len(s.shardDBURLs), n, n-1)
	case len(s.shardDBURLs) > 0 && !(s.jobs && n > 1):
		return errors.New("RETRYD_SHARD_DATABASE_URLS is only for the home shard's jobs API (RETRYD_SHARD=0, RETRYD_SHARDS above 1, RETRYD_JOBS on): unset it")
	}
	return nil
}

// connect migrates (when asked) and opens the pool and the NATS
// connection; closeAll releases both, checks are their readiness probes.
func connect(ctx context.Context, s settings, log zerolog.Logger) (*pgxpool.Pool, jetstream.JetStream, func(), []serve.Check, error) {
	if s.migrate {
		if err := migrations.Up(ctx, s.dbURL, log); err != nil {
			return nil, nil, nil, nil, fmt.Errorf("migrate: %w", err)
		}
	}
	// Each due emitter holds a connection during a burst, beside the policy
	// stage, the relay, the API and the jobs projection.
	b, err := backends.Open(ctx, backends.Options{DatabaseURL: s.dbURL, NATS: natsconn.OptionsFromEnv("retryd-scheduler"),
		MinPoolConns: int32(max(s.cfg.Emitters, scheduler.DefaultEmitters) + 6)}, log)
	if err != nil {
		return nil, nil, nil, nil, err
	}
	return b.Pool, b.JS, b.Close, b.Checks(), nil
}

// openAuthPool opens the pool of RETRYD_AUTH_DATABASE_URL, where the API
// tokens (and the audit of their changes) are, or returns pool when url
// is empty. Each scheduler shard has a database of its own, but a token
// is created once, through the home shard (shard 0): the other shards
// check it there, so one token works on every shard (docs/shards.md).
func openAuthPool(ctx context.Context, url string, pool *pgxpool.Pool) (*pgxpool.Pool, func(), error) {
	if url == "" {
		return pool, func() {}, nil
	}
	cfg, err := pgxpool.ParseConfig(url)
	if err != nil {
		return nil, nil, fmt.Errorf("RETRYD_AUTH_DATABASE_URL: %w", err)
	}
	cfg.MaxConns = 4
	p, err := pgxpool.NewWithConfig(ctx, cfg)
	if err != nil {
		return nil, nil, fmt.Errorf("open RETRYD_AUTH_DATABASE_URL: %w", err)
	}
	if err := p.Ping(ctx); err != nil {
		p.Close()
		return nil, nil, fmt.Errorf("connect to RETRYD_AUTH_DATABASE_URL: %w", err)
	}
	return p, p.Close, nil
}

// serveCmd runs the scheduler until ctx is cancelled (SIGTERM, SIGINT).
func serveCmd(ctx context.Context, log zerolog.Logger) error {
	s, err := readSettings(log)
	if err != nil {
		return err
	}
	shutdownTracing, err := telemetry.Setup(ctx, "retryd-scheduler", log)
	if err != nil {
		return err
	}
	defer telemetry.Flush(shutdownTracing, log) // first deferred: flushes last
	pool, js, closeAll, checks, err := connect(ctx, s, log)
	if err != nil {
		return err
	}
	defer closeAll()
	authPool, closeAuth, err := openAuthPool(ctx, s.authDBURL, pool)
	if err != nil {
		return err
	}
	defer closeAuth()

	reg := serve.NewRegistry()
	s.cfg.Pool, s.cfg.JS, s.cfg.Registerer = pool, js, reg
	sched, err := scheduler.New(s.cfg)
	if err != nil {
		return err
	}
	if err := sched.Start(ctx); err != nil {
		return err
	}
	// The scheduler owns the operator API, so it serves the token routes
	// (tokens are shared by every service through Postgres; by the
	// scheduler shards through the home shard's database).
	guard, tokens, err := s.auth.Guard(ctx, authPool, log, s.addr)
	if err != nil {
		return errors.Join(err, sched.Stop(context.WithoutCancel(ctx)))
	}
	health := &serve.Health{}
	go health.Watch(ctx, serve.DefaultProbeInterval, checks...)
	mux := serve.NewMux(reg, health)
	mux.Handle("/v1/", sched.Handler())
	auth.NewAPI(tokens).Register(mux)
	index := [][]serve.Route{scheduler.Routes(), auth.Routes()}
	var stops []func(context.Context) error
	if s.jobs {
		index = append(index, jobs.Routes())
		retry, closeShards, err := jobsRetryController(ctx, s, sched, js, log)
		if err != nil {
			return errors.Join(err, sched.Stop(context.WithoutCancel(ctx)))
		}
		defer closeShards()
		jobStops, err := startJobs(ctx, retry, pool, js, reg, log, mux)
		if err != nil {
			return errors.Join(err, sched.Stop(context.WithoutCancel(ctx)))
		}
		stops = jobStops
	}
	mux.Handle(serve.IndexPath, serve.IndexHandler(index...))
	if s.dashboard {
		mux.Handle("/ui/", http.StripPrefix("/ui", dashboard.Handler(dashboard.Config{
			Summary: func(ctx context.Context) (dashboard.Summary, error) { return scheduler.Summary(ctx, pool) },
		})))
	}
	// stopAll stops the jobs parts (API first: it releases bulk retries
	// through the scheduler) and then the scheduler.
	stopAll := func(ctx context.Context) error {
		var errs []error
		for i := len(stops) - 1; i >= 0; i-- {
			errs = append(errs, stops[i](ctx))
		}
		return errors.Join(append(errs, sched.Stop(ctx))...)
	}
	health.SetReady(true)
	srv := serve.NewServer(s.addr, telemetry.Handler(guard.Handler(mux), "retryd-scheduler"))
	srv.TLSConfig = s.tls
	httpCtx, stopHTTP := context.WithCancel(context.WithoutCancel(ctx))
	defer stopHTTP()
	httpDone := make(chan error, 1)
	go func() { httpDone <- serve.Run(httpCtx, srv, log) }()
	log.Info().Str("addr", s.addr).Msg("serving")

	select {
	case <-ctx.Done():
		log.Info().Msg("shutting down")
	case err := <-httpDone:
		health.SetReady(false)
		stopCtx, cancel := context.WithTimeout(context.Background(), s.shutdownTimeout)
		defer cancel()
		return errors.Join(err, stopAll(stopCtx))
	}
	// Readiness off first so traffic drains away, then the consumer is
	// drained and the loops stopped, then HTTP; the pool and the NATS
	// connection close last (deferred).
	health.SetReady(false)
	stopCtx, cancel := context.WithTimeout(context.Background(), s.shutdownTimeout)
	defer cancel()
	stopErr := stopAll(stopCtx)
	stopHTTP()
	return errors.Join(stopErr, <-httpDone)
}

// startJobs runs the jobs projection and mounts the jobs and analytics API
// (/v1/jobs, /v1/analytics, /v1/operations); it returns their stops in
// start order.
func startJobs(ctx context.Context, retry jobs.RetryController, pool *pgxpool.Pool, js jetstream.JetStream,
	reg prometheus.Registerer, log zerolog.Logger, mux *http.ServeMux) ([]func(context.Context) error, error) {
	proj, err := jobs.NewProjector(jobs.ProjectorConfig{Pool: pool, JS: js, Logger: log.With().Str("component", "jobs-projection").Logger(), Registerer: reg})
	if err != nil {
		return nil, fmt.Errorf("new jobs projection: %w", err)
	}
	if err := proj.Start(ctx); err != nil {
		return nil, fmt.Errorf("start jobs projection: %w", err)
	}
	api, err := jobs.NewAPI(jobs.APIConfig{Pool: pool, Retry: retry, JS: js,
		Logger: log.With().Str("component", "jobs-api").Logger(), Registerer: reg})
	if err != nil {
		return nil, errors.Join(fmt.Errorf("new jobs API: %w", err), proj.Stop(context.WithoutCancel(ctx)))
	}
	if err := api.Start(ctx); err != nil {
		return nil, errors.Join(fmt.Errorf("start jobs API: %w", err), proj.Stop(context.WithoutCancel(ctx)))
	}
	api.Register(mux)
	return []func(context.Context) error{proj.Stop, api.Stop}, nil
}

// jobsRetryController is what the jobs API retries and cancels through:
// this scheduler, or, on the home shard of a split deployment, a
// scheduler per shard, those of the other shards on their databases
// (RETRYD_SHARD_DATABASE_URLS) and never started (docs/shards.md).
func jobsRetryController(ctx context.Context, s settings, sched *scheduler.Scheduler, js jetstream.JetStream, log zerolog.Logger) (jobs.RetryController, func(), error) {
	if len(s.shardDBURLs) == 0 {
		return scheduler.RetryController{S: sched}, func() {}, nil
	}
	shards := []*scheduler.Scheduler{sched}
	var pools []*pgxpool.Pool
	closeAll := func() {
		for _, p := range pools {
			p.Close()
		}
	}
	for i, url := range s.shardDBURLs {
		k := i + 1
		cfg, err := pgxpool.ParseConfig(strings.TrimSpace(url))
		if err != nil {
			closeAll()
			return nil, nil, fmt.Errorf("RETRYD_SHARD_DATABASE_URLS (shard %d): %w", k, err)
		}
		cfg.MaxConns = 4
		pool, err := pgxpool.NewWithConfig(ctx, cfg)
		if err == nil {
			err = pool.Ping(ctx)
			pools = append(pools, pool)
		}
		if err != nil {
			closeAll()
			return nil, nil, fmt.Errorf("connect to shard %d's database (RETRYD_SHARD_DATABASE_URLS): %w", k, err)
		}
		c := s.cfg
		c.Pool, c.JS, c.Shard, c.Registerer = pool, js, k, nil
		c.Logger = log.With().Int("shard", k).Logger()
		other, err := scheduler.New(c)
		if err != nil {
			closeAll()
			return nil, nil, fmt.Errorf("shard %d: %w", k, err)
		}
		shards = append(shards, other)
	}
	return scheduler.ShardedRetryController{Shards: shards}, closeAll, nil
}

// rebuildCmd replays RETRIES into the (empty) projection and writes the
// counts as JSON to out.
func rebuildCmd(ctx context.Context, log zerolog.Logger, out io.Writer) error {
	s, err := readSettings(log)
	if err != nil {
		return err
	}
	pool, js, closeAll, _, err := connect(ctx, s, log)
	if err != nil {
		return err
	}
	defer closeAll()
	var opts []scheduler.RebuildOption
	if s.cfg.Classifier != nil {
		opts = append(opts, scheduler.WithClassifier(s.cfg.Classifier))
	}
	opts = append(opts, scheduler.WithShard(s.cfg.Shard, s.cfg.Shards))
	stats, err := scheduler.Rebuild(ctx, js, pool, log, opts...)
	if err != nil {
		return err
	}
	b, _ := json.MarshalIndent(stats, "", "  ")
	_, err = fmt.Fprintln(out, string(b))
	return err
}
