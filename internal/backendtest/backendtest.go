// Package backendtest starts the backends a test of a retryd service runs
// against: an embedded NATS server with a client (natstest) and a fresh
// migrated database (pgtest), bounded by a context. It exists because the
// tests of ingress, triggers, the scheduler, jobs and the end-to-end
// examples each wrote the same opening; it lives apart from servicetest so
// that the tests of the SDK (pkg/worker), which use servicetest, do not
// link pgtest.
//
// A package that uses it calls pgtest.Main from its TestMain.
package backendtest

import (
	"context"

	"github.com/jackc/pgx/v5/pgxpool"
	"github.com/nats-io/nats-server/v2/server"
	"github.com/nats-io/nats.go"
	"github.com/nats-io/nats.go/jetstream"
)

// Backends is what Start started.
type Backends struct {
	// Ctx bounds the test: it is cancelled after the timeout given to
	// Start, or when the test ends.
	Ctx  context.Context
	Srv  *server.Server
	NC   *nats.Conn
	JS   jetstream.JetStream
	Pool *pgxpool.Pool
}
