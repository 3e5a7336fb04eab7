// Package backends opens what a retryd service runs on: the Postgres pool
// and the NATS connection (with, optionally, the streams ensured), so the
// three binaries and any embedding program do it the same way.
package backends

import (
	"context"
	"errors"
	"fmt"
	"strings"

	"github.com/jackc/pgx/v5/pgxpool"
	"github.com/nats-io/nats.go"
	"github.com/nats-io/nats.go/jetstream"
	"github.com/rs/zerolog"

	"github.com/retryd/retryd/internal/natsconn"
	"github.com/retryd/retryd/internal/serve"
	"github.com/retryd/retryd/internal/streams"
)

// Options says what to open.
type Options struct {
	// DatabaseURL is the Postgres URL (required).
	DatabaseURL string
	// NATS is the connection's options; natsconn.OptionsFromEnv(name) for
	// the binaries.
	NATS natsconn.Options
	// MinPoolConns raises the pool's size to at least this many connections
	// unless the URL sets pool_max_conns itself.
	MinPoolConns int32
	// EnsureStreams, when set, creates the streams that are missing with
	// these options once connected, and logs the existing ones whose
	// configuration differs from this version's (streams.CreateMissing:
	// changing a stream is the admin's `retryd streams ensure`).
	EnsureStreams *streams.Options
}

// Backends are the open connections.
type Backends struct {
	Pool *pgxpool.Pool
	NC   *nats.Conn
	JS   jetstream.JetStream
}

// Open connects to Postgres and NATS; on error nothing stays open.
func Open(ctx context.Context, o Options, log zerolog.Logger) (*Backends, error) {
	if o.DatabaseURL == "" {
		return nil, errors.New("open backends: DATABASE_URL is required")
	}
	pcfg, err := pgxpool.ParseConfig(o.DatabaseURL)
	if err != nil {
		return nil, fmt.Errorf("parse DATABASE_URL: %w", err)
	}
	if !strings.Contains(o.DatabaseURL, "pool_max_conns") {
		pcfg.MaxConns = max(pcfg.MaxConns, o.MinPoolConns)
	}
	pool, err := pgxpool.NewWithConfig(ctx, pcfg)
	if err != nil {
		return nil, fmt.Errorf("open database: %w", err)
	}
	nc, js, err := natsconn.Connect(ctx, o.NATS, log)
	if err != nil {
		pool.Close()
		return nil, fmt.Errorf("connect to nats: %w", err)
	}
	b := &Backends{Pool: pool, NC: nc, JS: js}
	if o.EnsureStreams != nil {
		drift, err := streams.CreateMissing(ctx, js, *o.EnsureStreams)
		if err != nil {
			b.Close()
			return nil, fmt.Errorf("ensure streams: %w", err)
		}
		for _, d := range drift {
			log.Warn().Str("differs", d).Msg("stream configuration differs from this version's: run `retryd streams ensure` as the NATS admin")
		}
	}
	return b, nil
}

// Checks are the readiness probes of the connections (see Checks).
func (b *Backends) Checks() []serve.Check { return Checks(b.Pool, b.NC) }

// Checks are readiness probes of a pool and a NATS connection: Postgres
// answers a ping, NATS is connected and answers a round trip.
func Checks(pool *pgxpool.Pool, nc *nats.Conn) []serve.Check {
	return []serve.Check{
		{Name: "postgres", Probe: pool.Ping},
		{Name: "nats", Probe: func(ctx context.Context) error {
			if st := nc.Status(); st != nats.CONNECTED {
				return fmt.Errorf("nats connection is %s", st)
			}
			return nc.FlushWithContext(ctx)
		}},
	}
}

// Close drains the NATS connection (pending publishes go out) and closes
// the pool. Call it after the service stopped.
func (b *Backends) Close() {
	_ = b.NC.Drain()
	b.Pool.Close()
}
