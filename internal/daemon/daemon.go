// Package daemon holds what the service binaries (retryd-ingress,
// retryd-triggers) do alike around their service: the logger, the shared
// part of the environment, the backends, tracing and the auth guard at
// start (Open), and serving HTTP up to the graceful stop (Host.Serve);
// Run is the whole of it, from Open to Close, around the binary's service.
// Each binary keeps its own variables, its service and its listeners.
package daemon

import (
	"context"
	"crypto/tls"
	"errors"
	"fmt"
	"os"
	"time"

	"github.com/jackc/pgx/v5/pgxpool"
	"github.com/nats-io/nats.go/jetstream"
	"github.com/prometheus/client_golang/prometheus"
	"github.com/rs/zerolog"

	"github.com/retryd/retryd/internal/auth"
	"github.com/retryd/retryd/internal/backends"
	"github.com/retryd/retryd/internal/envvar"
	"github.com/retryd/retryd/internal/natsconn"
	"github.com/retryd/retryd/internal/serve"
	"github.com/retryd/retryd/internal/streams"
	"github.com/retryd/retryd/internal/telemetry"
)

// Logger is a binary's logger: JSON lines on stderr with a timestamp and
// the service's name, at RETRYD_LOG_LEVEL (default info; an unknown level
// keeps info).
func Logger(service string) zerolog.Logger {
	log := zerolog.New(os.Stderr).With().Timestamp().Str("service", service).Logger()
	if lvl, err := zerolog.ParseLevel(envvar.String("RETRYD_LOG_LEVEL", "info")); err == nil && lvl != zerolog.NoLevel {
		log = log.Level(lvl)
	}
	return log
}

// Env is the part of the environment every service binary reads the same
// way: DATABASE_URL, the auth settings, the HTTPS certificate and the
// streams' limits (RETRYD_STREAM_*), which a missing stream is created
// with.
type Env struct {
	DatabaseURL string
	Auth        auth.Config
	TLS         *tls.Config // nil: plain HTTP
	Streams     streams.Options
}

// ReadEnv reads Env, adding to e what is wrong with it; listeners are the
// addresses the binary serves on, which decide whether RETRYD_AUTH=off is
// allowed.
func ReadEnv(e *envvar.Reader, listeners ...string) Env {
	var env Env
	env.DatabaseURL = os.Getenv("DATABASE_URL")
	var err error
	env.Auth, err = auth.FromEnv(nil)
	e.Add(err)
	e.Add(env.Auth.Validate(listeners...))
	env.TLS, err = serve.TLSFromEnv().Server()
	e.Add(err)
	env.Streams = streams.OptionsFromEnv(e)
	if env.DatabaseURL == "" {
		e.Add(errors.New("DATABASE_URL is required"))
	}
	return env
}

// Options says how to open a Host.
type Options struct {
	// Service names the binary to the tracer, to NATS and in its spans
	// ("retryd-ingress").
	Service string
	// Migrate, when set, is run on the database before anything connects
	// (migrations.Up; the internal module does not link the migrations).
	Migrate func(ctx context.Context, dbURL string, log zerolog.Logger) error
	// EnsureStreams creates the missing streams once connected, and lets
	// the service recreate a deleted one (Host.Streams).
	EnsureStreams bool
	// Listeners are the addresses served, for the auth guard.
	Listeners []string
	// ShutdownTimeout bounds Run's graceful stop of the service (see
	// Host.Serve).
	ShutdownTimeout time.Duration
	// Ready, when set, is told by Run the listeners' addresses, in order,
	// once they listen (see Host.Serve).
	Ready func(addrs []string)
}

// Host is what a service runs on, open: the service's Config takes Pool,
// JS, Registry, Health and Streams.
type Host struct {
	Pool     *pgxpool.Pool
	JS       jetstream.JetStream
	Registry *prometheus.Registry
	Health   *serve.Health
	// Streams is nil unless Options.EnsureStreams: a service that is not
	// to create streams does not recreate them either.
	Streams *streams.Options

	service string
	tls     *tls.Config
	guard   serve.Guard
	close   func()
}

// Open sets up tracing, migrates, connects to Postgres and NATS, builds
// the auth guard and starts watching the connections' health, until ctx
// is done. On error nothing stays open; otherwise Close releases it all.
func Open(ctx context.Context, env Env, o Options, log zerolog.Logger) (*Host, error) {
	shutdownTracing, err := telemetry.Setup(ctx, o.Service, log)
	if err != nil {
		return nil, err
	}
	h, err := open(ctx, env, o, log)
	if err != nil {
		telemetry.Flush(shutdownTracing, log)
		return nil, err
	}
	closeBackends := h.close
	h.close = func() {
		closeBackends()
		telemetry.Flush(shutdownTracing, log) // last: spans of the stop go out
	}
	return h, nil
}

func open(ctx context.Context, env Env, o Options, log zerolog.Logger) (*Host, error) {
	if o.Migrate != nil {
		if err := o.Migrate(ctx, env.DatabaseURL, log); err != nil {
			return nil, fmt.Errorf("migrate: %w", err)
		}
	}
	h := &Host{service: o.Service, tls: env.TLS, Registry: serve.NewRegistry(), Health: &serve.Health{}}
	if o.EnsureStreams {
		opts := env.Streams
		h.Streams = &opts
	}
	b, err := backends.Open(ctx, backends.Options{DatabaseURL: env.DatabaseURL, NATS: natsconn.OptionsFromEnv(o.Service), EnsureStreams: h.Streams}, log)
	if err != nil {
		return nil, err
	}
	h.Pool, h.JS, h.close = b.Pool, b.JS, b.Close
	h.guard, _, err = env.Auth.Guard(ctx, b.Pool, log, o.Listeners...)
	if err != nil {
		b.Close()
		return nil, err
	}
	go h.Health.Watch(ctx, serve.DefaultProbeInterval, b.Checks()...)
	return h, nil
}

// Close drains NATS, closes the pool and flushes the traces. Call it after
// the service stopped.
func (h *Host) Close() { h.close() }

// Service is what a binary runs on its Host.
type Service interface {
	// Start runs the service; ctx bounds the start only.
	Start(ctx context.Context) error
	// Stop ends it gracefully within ctx.
	Stop(ctx context.Context) error
}

// Run is a binary's life around its service: it opens a Host (Open),
// builds the service on it with build, which also says what each listener
// serves, starts the service and serves until ctx is done or a server
// fails (Host.Serve, with o.ShutdownTimeout and o.Ready), then closes the
// Host. Each binary keeps its own Config and Service type: build fills the
// Config from the Host and calls the service's New.
func Run(ctx context.Context, env Env, o Options, log zerolog.Logger,
	build func(*Host) (Service, []Listener, error)) error {
	host, err := Open(ctx, env, o, log)
	if err != nil {
		return err
	}
	defer host.Close()
	svc, listeners, err := build(host)
	if err != nil {
		return err
	}
	if err := svc.Start(ctx); err != nil {
		return err
	}
	return host.Serve(ctx, log, listeners, svc.Stop, o.ShutdownTimeout, o.Ready)
}
