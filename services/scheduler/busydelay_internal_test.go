package scheduler

import (
	"testing"
	"time"

	"github.com/stretchr/testify/require"
)

// A busy item's fact comes back soon on its first hand-backs (the due
// loop's claim commits in milliseconds) and no more often than nakDelay
// when the holder stays (a frozen peer).
func TestBusyDelayBacksOffToNakDelay(t *testing.T) {
	t.Parallel()
	for delivered, want := range map[uint64]time.Duration{
		0: 50 * time.Millisecond, 1: 50 * time.Millisecond, 2: 100 * time.Millisecond,
		3: 200 * time.Millisecond, 7: 3200 * time.Millisecond, 8: nakDelay, 1000: nakDelay,
	} {
		require.Equal(t, want, busyDelay(delivered), "delivery %d", delivered)
	}
}
