package backendtest

import (
	"context"
	"testing"
	"time"

	"github.com/retryd/retryd/internal/natstest"
	"github.com/retryd/retryd/migrations/pgtest"
)

// Start starts, in this order, a context that ends within the timeout
// (within 0: only when the test ends), an embedded NATS server, a client connected to it and a fresh database
// with a pool on it; each is stopped or dropped in t.Cleanup, in the
// reverse order. The streams are not created: a test that wants them
// calls natstest.EnsureStreams, one that runs a component creating its own
// streams does not.
func Start(t testing.TB, within time.Duration) Backends {
	t.Helper()
	var ctx context.Context
	var cancel context.CancelFunc
	if within > 0 {
		ctx, cancel = context.WithTimeout(context.Background(), within)
	} else {
		ctx, cancel = context.WithCancel(context.Background())
	}
	t.Cleanup(cancel)
	srv := natstest.RunServer(t)
	nc, js := natstest.Connect(t, srv)
	return Backends{Ctx: ctx, Srv: srv, NC: nc, JS: js, Pool: pgtest.NewPool(t)}
}
