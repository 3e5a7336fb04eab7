package jobs

import (
	"context"
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
