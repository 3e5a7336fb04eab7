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
	"errors"
	"fmt"
	"net"
	"net/http"
	"os"
	"time"

	"github.com/rs/zerolog"

	"github.com/retryd/retryd/internal/auth"
	"github.com/retryd/retryd/internal/backends"
	"github.com/retryd/retryd/internal/envvar"
	"github.com/retryd/retryd/internal/natsconn"
	"github.com/retryd/retryd/internal/serve"
	"github.com/retryd/retryd/internal/streams"
	"github.com/retryd/retryd/internal/telemetry"
	"github.com/retryd/retryd/migrations"
	"github.com/retryd/retryd/pkg/errclass"
	"github.com/retryd/retryd/services/ingress"
)

func main() {
	log := zerolog.New(os.Stderr).With().Timestamp().Str("service", "retryd-ingress").Logger()
	if lvl, err := zerolog.ParseLevel(envvar.String("RETRYD_LOG_LEVEL", "info")); err == nil && lvl != zerolog.NoLevel {
		log = log.Level(lvl)
	}
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
	dbURL := os.Getenv("DATABASE_URL")
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
	authCfg, err := auth.FromEnv(nil)
	e.Add(err)
	e.Add(authCfg.Validate(listeners...))
	tlsCfg, err := serve.TLSFromEnv().Server()
	e.Add(err)
	if dbURL == "" {
		e.Add(errors.New("DATABASE_URL is required"))
	}
	if err := e.Err(); err != nil {
		return err
	}
	shutdownTracing, err := telemetry.Setup(ctx, "retryd-ingress", log)
	if err != nil {
		return err
	}
	defer telemetry.Flush(shutdownTracing, log) // first deferred: flushes last

	if migrate {
		if err := migrations.Up(ctx, dbURL, log); err != nil {
			return fmt.Errorf("migrate: %w", err)
		}
	}
	var ensureStreams *streams.Options
	if ensure {
		ensureStreams = &streams.Options{}
	}
	b, err := backends.Open(ctx, backends.Options{DatabaseURL: dbURL, NATS: natsconn.OptionsFromEnv("retryd-ingress"), EnsureStreams: ensureStreams}, log)
	if err != nil {
		return err
	}
	defer b.Close()
	pool, js := b.Pool, b.JS

	guard, _, err := authCfg.Guard(ctx, pool, log, listeners...)
	if err != nil {
		return err
	}
	reg := serve.NewRegistry()
	health := &serve.Health{}
	go health.Watch(ctx, serve.DefaultProbeInterval, b.Checks()...)
	cfg.Pool, cfg.JS, cfg.Registerer, cfg.Health = pool, js, reg, health
	cfg.Streams = ensureStreams // nil: the service does not recreate streams either
	svc, err := ingress.New(cfg)
	if err != nil {
		return err
	}
	if err := svc.Start(ctx); err != nil {
		return err
	}

	// One listener serves everything, or, with RETRYD_OPERATOR_ADDR, the
	// intake listener serves intake alone and the operator listener the
	// rest; both answer /healthz, /readyz and /metrics.
	type listener struct {
		addr    string
		handler http.Handler
		routes  []serve.Route
	}
	served := []listener{{addr, svc.Handler(), ingress.Routes()}}
	if operatorAddr != "" {
		served = []listener{{addr, svc.IntakeHandler(), ingress.IntakeRoutes()}, {operatorAddr, svc.OperatorHandler(), ingress.OperatorRoutes()}}
	}
	lns := make([]net.Listener, 0, len(served))
	for _, l := range served {
		ln, err := net.Listen("tcp", l.addr)
		if err != nil {
			for _, open := range lns {
				_ = open.Close()
			}
			_ = svc.Stop(context.Background())
			return fmt.Errorf("listen on %s: %w", l.addr, err)
		}
		lns = append(lns, ln)
	}
	httpCtx, stopHTTP := context.WithCancel(context.WithoutCancel(ctx))
	defer stopHTTP()
	httpDone := make(chan error, len(served))
	for i, l := range served {
		mux := serve.NewMux(reg, health)
		mux.Handle("/v1/", l.handler)
		mux.Handle(serve.IndexPath, serve.IndexHandler(l.routes))
		srv := serve.NewServer("", telemetry.Handler(guard.Handler(mux), "retryd-ingress"))
		srv.TLSConfig = tlsCfg
		go func(ln net.Listener) { httpDone <- serve.Serve(httpCtx, srv, ln, log) }(lns[i])
	}
	if ready != nil {
		ready(lns[0].Addr().String(), lns[len(lns)-1].Addr().String())
	}

	select {
	case <-ctx.Done():
		log.Info().Msg("shutting down")
	case err := <-httpDone:
		_ = svc.Stop(context.Background())
		stopHTTP()
		for range len(served) - 1 {
			err = errors.Join(err, <-httpDone)
		}
		return err
	}
	// Readiness off and consumers drained first, so nothing is half done;
	// the HTTP server keeps answering intake until then.
	stopCtx, cancel := context.WithTimeout(context.Background(), shutdownTimeout)
	defer cancel()
	errs := []error{svc.Stop(stopCtx)}
	stopHTTP()
	for range served {
		errs = append(errs, <-httpDone)
	}
	return errors.Join(errs...)
}
