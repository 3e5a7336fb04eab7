// Command retryd-ingress runs retryd's ingress: HTTP and NATS intake, the
// per-source gate and durable event-ingress retries.
//
// Configuration is read from the environment:
//
//	DATABASE_URL                        Postgres URL (required)
//	NATS_URL, NATS_CREDS, NATS_NKEY,    NATS connection (see internal/natsconn)
//	NATS_USER, NATS_PASSWORD, NATS_TOKEN,
//	NATS_TLS_CERT, NATS_TLS_KEY, NATS_TLS_CA
//	RETRYD_HTTP_ADDR                    listen address (default :8081): intake, and the operator API unless
//	                                    RETRYD_OPERATOR_ADDR is set
//	RETRYD_OPERATOR_ADDR                listen address of the operator API alone (default: none, on RETRYD_HTTP_ADDR)
//	RETRYD_HTTP_TLS_CERT, RETRYD_HTTP_TLS_KEY  PEM certificate and key: serve HTTPS (both or neither)
//	RETRYD_LOG_LEVEL                    debug, info (default), warn, error
//	RETRYD_INTAKE_RATE                  intake requests a second per caller (token), 0 (default): no limit
//	RETRYD_INTAKE_BURST                 requests at once above the rate (default: the rate rounded up)
//	RETRYD_INGRESS_MIGRATE              apply migrations at start (default true)
//	RETRYD_INGRESS_ENSURE_STREAMS       create missing streams at start (default true)
//	RETRYD_STREAM_<NAME>_MAX_BYTES      max_bytes of a stream it creates, e.g. RETRYD_STREAM_RETRIES_MAX_BYTES=8GiB
//	RETRYD_STREAM_<NAME>_MAX_AGE        max_age of a stream it creates, e.g. 720h (docs/contract.md has the defaults)
//	RETRYD_SHARDS                       scheduler shards of a RETRIES it creates (docs/shards.md)
//	RETRYD_INGRESS_MAX_BODY_BYTES       POST /v1/events body cap (default 1048576)
//	RETRYD_INGRESS_MAX_BATCH_BODY_BYTES POST /v1/events:batch body cap (default 8388608)
//	RETRYD_INGRESS_MAX_BATCH_EVENTS     events per batch (default 500)
//	RETRYD_INGRESS_CONCURRENCY          messages in flight per consumer (default 4)
//	RETRYD_INGRESS_ACK_WAIT             consumer ack wait (default 30s)
//	RETRYD_INGRESS_PAUSED_CLASS         class of source_paused deferrals: temporary (default) or rate_limit
//	RETRYD_INGRESS_SOURCE_CACHE_TTL     intake's allowed-types cache (default 1s)
//	RETRYD_INGRESS_RECONCILE_INTERVAL   reconciler period (default 30s)
//	RETRYD_INGRESS_RECONCILE_AFTER      republish unconfirmed deferrals after (default 3m)
//	RETRYD_INGRESS_INBOX_RETENTION      prune inbox rows older than (default 168h; negative disables)
//	RETRYD_INGRESS_SHUTDOWN_TIMEOUT     bound on the graceful stop (default 30s)
package main

import (
	"context"
	"os"
	"time"

	"github.com/rs/zerolog"

	"github.com/retryd/retryd/internal/daemon"
	"github.com/retryd/retryd/internal/envvar"
	"github.com/retryd/retryd/internal/serve"
	"github.com/retryd/retryd/migrations"
	"github.com/retryd/retryd/pkg/errclass"
	"github.com/retryd/retryd/services/ingress"
)

func main() {
	log := daemon.Logger("retryd-ingress")
	ctx, stop := serve.SignalContext()
	defer stop()
	if err := run(ctx, log, nil); err != nil {
		log.Error().Err(err).Msg("retryd-ingress failed")
		os.Exit(1)
	}
}

// run starts ingress as the environment says and serves until ctx is done,
// then shuts down gracefully. ready, when set, is told the HTTP address
// (intake) and the operator API's (the same one unless
// RETRYD_OPERATOR_ADDR is set) once the service is ready.
func run(ctx context.Context, log zerolog.Logger, ready func(addr, operatorAddr string)) error {
	e := &envvar.Reader{}
	addr := envvar.String("RETRYD_HTTP_ADDR", ":8081")
	// Empty keeps every route on addr, as before the operator API could
	// move: existing deployments and producers keep working.
	operatorAddr := os.Getenv("RETRYD_OPERATOR_ADDR")
	listeners := []string{addr}
	if operatorAddr != "" {
		listeners = append(listeners, operatorAddr)
	}
	migrate := e.Bool("RETRYD_INGRESS_MIGRATE", true)
	ensure := e.Bool("RETRYD_INGRESS_ENSURE_STREAMS", true)
	shutdownTimeout := e.Duration("RETRYD_INGRESS_SHUTDOWN_TIMEOUT", 30*time.Second)
	cfg := ingress.Config{
		Logger:            log,
		MaxBodyBytes:      e.Int64("RETRYD_INGRESS_MAX_BODY_BYTES"),
		MaxBatchBodyBytes: e.Int64("RETRYD_INGRESS_MAX_BATCH_BODY_BYTES"),
		MaxBatchEvents:    int(e.Int64("RETRYD_INGRESS_MAX_BATCH_EVENTS")),
		IntakeRate:        e.Float("RETRYD_INTAKE_RATE"),
		IntakeBurst:       e.Int("RETRYD_INTAKE_BURST"),
		Concurrency:       int(e.Int64("RETRYD_INGRESS_CONCURRENCY")),
		AckWait:           e.Duration("RETRYD_INGRESS_ACK_WAIT", 0),
		PausedClass:       errclass.Class(os.Getenv("RETRYD_INGRESS_PAUSED_CLASS")),
		SourceCacheTTL:    e.Duration("RETRYD_INGRESS_SOURCE_CACHE_TTL", 0),
		ReconcileInterval: e.Duration("RETRYD_INGRESS_RECONCILE_INTERVAL", 0),
		ReconcileAfter:    e.Duration("RETRYD_INGRESS_RECONCILE_AFTER", 0),
		InboxRetention:    e.Duration("RETRYD_INGRESS_INBOX_RETENTION", 0),
	}
	env := daemon.ReadEnv(e, listeners...)
	if err := e.Err(); err != nil {
		return err
	}
	opts := daemon.Options{Service: "retryd-ingress", EnsureStreams: ensure, Listeners: listeners, ShutdownTimeout: shutdownTimeout}
	if migrate {
		opts.Migrate = migrations.Up
	}
	if ready != nil {
		opts.Ready = func(addrs []string) { ready(addrs[0], addrs[len(addrs)-1]) }
	}
	return daemon.Run(ctx, env, opts, log, func(host *daemon.Host) (daemon.Service, []daemon.Listener, error) {
		cfg.Pool, cfg.JS, cfg.Registerer, cfg.Health, cfg.Streams = host.Pool, host.JS, host.Registry, host.Health, host.Streams
		svc, err := ingress.New(cfg)
		if err != nil {
			return nil, nil, err
		}
		// One listener serves everything, or, with RETRYD_OPERATOR_ADDR,
		// the intake listener serves intake alone and the operator
		// listener the rest. Readiness off and consumers drained first at
		// the stop, so nothing is half done; HTTP keeps answering intake
		// until then.
		if operatorAddr == "" {
			return svc, []daemon.Listener{{Addr: addr, Handler: svc.Handler(), Routes: ingress.Routes()}}, nil
		}
		return svc, []daemon.Listener{
			{Addr: addr, Handler: svc.IntakeHandler(), Routes: ingress.IntakeRoutes()},
			{Addr: operatorAddr, Handler: svc.OperatorHandler(), Routes: ingress.OperatorRoutes()},
		}, nil
	})
}
