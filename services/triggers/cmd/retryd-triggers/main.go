// Command retryd-triggers runs retryd's triggers service: trigger
// definitions (HTTP API), deliveries of admitted events to triggers, run
// launches, and throttle and max-concurrency retries.
//
// Configuration is read from the environment:
//
//	DATABASE_URL                          Postgres URL (required)
//	NATS_URL, NATS_CREDS, NATS_NKEY,      NATS connection (see internal/natsconn)
//	NATS_USER, NATS_PASSWORD, NATS_TOKEN,
//	NATS_TLS_CERT, NATS_TLS_KEY, NATS_TLS_CA
//	RETRYD_HTTP_ADDR                      listen address (default :8082)
//	RETRYD_HTTP_TLS_CERT, RETRYD_HTTP_TLS_KEY  PEM certificate and key: serve HTTPS (both or neither)
//	RETRYD_LOG_LEVEL                      debug, info (default), warn, error
//	RETRYD_TRIGGERS_MIGRATE               apply migrations at start (default true)
//	RETRYD_TRIGGERS_ENSURE_STREAMS        create missing streams at start (default true)
//	RETRYD_STREAM_<NAME>_MAX_BYTES        max_bytes of a stream it creates, e.g. RETRYD_STREAM_RETRIES_MAX_BYTES=8GiB
//	RETRYD_STREAM_<NAME>_MAX_AGE          max_age of a stream it creates, e.g. 720h (docs/contract.md has the defaults)
//	RETRYD_SHARDS                         scheduler shards of a RETRIES it creates (docs/shards.md)
//	RETRYD_TRIGGERS_CONCURRENCY           messages handled at once per consumer (default 4;
//	                                      RETRYD_TRIGGERS_WORKERS, its old name, still works)
//	RETRYD_TRIGGERS_ACK_WAIT              consumer ack wait (default 30s)
//	RETRYD_TRIGGERS_NAK_DELAY             redelivery delay after a transient error (default 1s)
//	RETRYD_TRIGGERS_COST_LIMIT            CEL cost limit per evaluation (default 100000)
//	RETRYD_TRIGGERS_PROGRAM_CACHE         compiled trigger versions kept (default 1024)
//	RETRYD_TRIGGERS_MAX_BODY_BYTES        API body cap (default 65536)
//	RETRYD_TRIGGERS_RELAY_INTERVAL        outbox relay poll period (default 500ms)
//	RETRYD_TRIGGERS_RECONCILE_INTERVAL    reconciler period (default 1m; negative disables)
//	RETRYD_TRIGGERS_RECONCILE_AFTER       republish unconfirmed held deliveries after (default 2m)
//	RETRYD_TRIGGERS_CHECK_INTERVAL        how often deleted consumers (and streams) are recreated (default 30s)
//	RETRYD_TRIGGERS_RUN_TIMEOUT           a run without its end frees its concurrency slot after (default 1h)
//	RETRYD_TRIGGERS_LEASE_INTERVAL        how often ended run leases are looked for (default 1s; negative disables)
//	RETRYD_TRIGGERS_INBOX_RETENTION       prune inbox rows older than (default 168h; negative disables)
//	RETRYD_TRIGGERS_SHUTDOWN_TIMEOUT      bound on the graceful stop (default 30s)
package main

import (
	"os"
	"time"

	"github.com/rs/zerolog"

	"github.com/retryd/retryd/internal/daemon"
	"github.com/retryd/retryd/internal/envvar"
	"github.com/retryd/retryd/internal/serve"
	"github.com/retryd/retryd/migrations"
	"github.com/retryd/retryd/services/triggers"
)

func main() {
	log := daemon.Logger("retryd-triggers")
	if err := run(log); err != nil {
		log.Error().Err(err).Msg("retryd-triggers failed")
		os.Exit(1)
	}
}

func run(log zerolog.Logger) error {
	ctx, stop := serve.SignalContext()
	defer stop()

	e := &envvar.Reader{}
	e.Renamed("RETRYD_TRIGGERS_CONCURRENCY", "RETRYD_TRIGGERS_WORKERS")
	addr := envvar.String("RETRYD_HTTP_ADDR", ":8082")
	migrate := e.Bool("RETRYD_TRIGGERS_MIGRATE", true)
	ensure := e.Bool("RETRYD_TRIGGERS_ENSURE_STREAMS", true)
	shutdownTimeout := e.Duration("RETRYD_TRIGGERS_SHUTDOWN_TIMEOUT", 30*time.Second)
	cfg := triggers.Config{
		Logger:            log,
		Concurrency:       int(e.Int64("RETRYD_TRIGGERS_CONCURRENCY")),
		AckWait:           e.Duration("RETRYD_TRIGGERS_ACK_WAIT", 0),
		NakDelay:          e.Duration("RETRYD_TRIGGERS_NAK_DELAY", 0),
		CostLimit:         uint64(e.Int64("RETRYD_TRIGGERS_COST_LIMIT")),
		ProgramCacheSize:  int(e.Int64("RETRYD_TRIGGERS_PROGRAM_CACHE")),
		MaxBodyBytes:      e.Int64("RETRYD_TRIGGERS_MAX_BODY_BYTES"),
		RelayInterval:     e.Duration("RETRYD_TRIGGERS_RELAY_INTERVAL", 0),
		ReconcileInterval: e.Duration("RETRYD_TRIGGERS_RECONCILE_INTERVAL", 0),
		ReconcileAfter:    e.Duration("RETRYD_TRIGGERS_RECONCILE_AFTER", 0),
		InboxRetention:    e.Duration("RETRYD_TRIGGERS_INBOX_RETENTION", 0),
		CheckInterval:     e.Duration("RETRYD_TRIGGERS_CHECK_INTERVAL", 0),
		RunTimeout:        e.Duration("RETRYD_TRIGGERS_RUN_TIMEOUT", 0),
		LeaseInterval:     e.Duration("RETRYD_TRIGGERS_LEASE_INTERVAL", 0),
	}
	env := daemon.ReadEnv(e, addr)
	if err := e.Err(); err != nil {
		return err
	}
	for _, d := range e.Deprecations() {
		log.Warn().Msg(d)
	}
	opts := daemon.Options{Service: "retryd-triggers", EnsureStreams: ensure, Listeners: []string{addr}, ShutdownTimeout: shutdownTimeout}
	if migrate {
		opts.Migrate = migrations.Up
	}
	return daemon.Run(ctx, env, opts, log, func(host *daemon.Host) (daemon.Service, []daemon.Listener, error) {
		cfg.Pool, cfg.JS, cfg.Registerer, cfg.Health, cfg.Streams = host.Pool, host.JS, host.Registry, host.Health, host.Streams
		svc, err := triggers.New(cfg)
		if err != nil {
			return nil, nil, err
		}
		// Readiness off and consumers drained first at the stop; the API
		// keeps answering until then.
		return svc, []daemon.Listener{{Addr: addr, Handler: svc.Handler(), Routes: triggers.Routes()}}, nil
	})
}
