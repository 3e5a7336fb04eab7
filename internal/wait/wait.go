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
