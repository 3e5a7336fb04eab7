package jobs

import (
	"context"
	"fmt"
	"sync"
)

// lifecycle is the Start/Stop state of the API's bulk runner and of the
// projector: Start runs once, Stop is idempotent and ends the loops
// Start began. mu also guards what its owner keeps beside it (the API's
// running operations).
type lifecycle struct {
	mu      sync.Mutex
	started bool
	stopped bool
	cancel  context.CancelFunc
}

// start runs begin once, under the lock, with the context of the loops
// it starts, which stop ends. A second start, even after stop, is an
// error; so is begin's, and then nothing is started.
func (l *lifecycle) start(what string, begin func(loops context.Context) error) error {
	l.mu.Lock()
	defer l.mu.Unlock()
	if l.started {
		return fmt.Errorf("start %s: already started", what)
	}
	ctx, cancel := context.WithCancel(context.Background())
	if err := begin(ctx); err != nil {
		cancel()
		return fmt.Errorf("start %s: %w", what, err)
	}
	l.started, l.cancel = true, cancel
	return nil
}

// stop marks the owner stopped and cancels its loops. It reports whether
// there was anything to stop: false before Start, and on every Stop after
// the first.
func (l *lifecycle) stop() bool {
	l.mu.Lock()
	defer l.mu.Unlock()
	if !l.started || l.stopped {
		return false
	}
	l.stopped = true
	l.cancel()
	return true
}
