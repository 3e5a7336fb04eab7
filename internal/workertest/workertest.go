// Package workertest starts an SDK worker (pkg/worker) for a test: the
// SDK's own tests and the end-to-end examples run their job handlers the
// same way.
package workertest

import (
	"context"
	"testing"
	"time"

	"github.com/retryd/retryd/internal/servicetest"
	"github.com/retryd/retryd/pkg/worker"
)

// Start starts a worker of cfg with handlers by job type, on ctx, and
// stops it when the test ends. A FetchWait left zero is 200 ms, so that a
// test does not wait out the SDK's default between empty fetches.
func Start(t testing.TB, ctx context.Context, cfg worker.Config, handlers map[string]worker.Handler) *worker.Worker {
	t.Helper()
	if cfg.FetchWait == 0 {
		cfg.FetchWait = 200 * time.Millisecond
	}
	w, err := worker.New(cfg)
	if err != nil {
		t.Fatalf("workertest: new worker: %v", err)
	}
	for typ, h := range handlers {
		if err := w.Handle(typ, h); err != nil {
			t.Fatalf("workertest: handle %s: %v", typ, err)
		}
	}
	if err := w.Start(ctx); err != nil {
		t.Fatalf("workertest: start worker: %v", err)
	}
	servicetest.StopOnCleanup(t, 5*time.Second, w.Stop)
	return w
}
