// Package wait holds waits that end early when their context does.
package wait

import (
	"context"
	"sync"
	"time"
)

// Sleep waits d, or until ctx ends: then it returns ctx's error.
func Sleep(ctx context.Context, d time.Duration) error {
	t := time.NewTimer(d)
	defer t.Stop()
	select {
	case <-t.C:
		return nil
	case <-ctx.Done():
		return ctx.Err()
	}
}

// Group waits for wg, or until ctx ends: then it returns ctx's error and
// leaves the goroutines of wg running.
func Group(ctx context.Context, wg *sync.WaitGroup) error {
	done := make(chan struct{})
	go func() {
		wg.Wait()
		close(done)
	}()
	select {
	case <-done:
		return nil
	case <-ctx.Done():
		return ctx.Err()
	}
}

// Every calls fn at once and then every period, until ctx ends (fn is not
// called again once it has). A call that outlasts period delays the next
// one rather than piling calls up.
func Every(ctx context.Context, period time.Duration, fn func()) {
	ticks(ctx, period, true, fn)
}

// Ticks is Every without the call at once: the first is one period on.
func Ticks(ctx context.Context, period time.Duration, fn func()) {
	ticks(ctx, period, false, fn)
}

func ticks(ctx context.Context, period time.Duration, now bool, fn func()) {
	t := time.NewTicker(period)
	defer t.Stop()
	if now {
		fn()
	}
	for {
		select {
		case <-ctx.Done():
			return
		case <-t.C:
		}
		// Both may be ready at once: the end wins.
		if ctx.Err() != nil {
			return
		}
		fn()
	}
}
