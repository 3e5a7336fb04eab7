package wait_test

import (
	"context"
	"sync"
	"testing"
	"time"

	"github.com/stretchr/testify/require"

	"github.com/retryd/retryd/internal/wait"
)

func TestSleep(t *testing.T) {
	t.Parallel()
	require.NoError(t, wait.Sleep(context.Background(), time.Millisecond))
	ctx, cancel := context.WithCancel(context.Background())
	cancel()
	start := time.Now()
	require.ErrorIs(t, wait.Sleep(ctx, time.Hour), context.Canceled)
	require.Less(t, time.Since(start), time.Minute, "an ended context ends the wait at once")
}

func TestGroup(t *testing.T) {
	t.Parallel()
	var wg sync.WaitGroup
	require.NoError(t, wait.Group(context.Background(), &wg))
	wg.Add(1)
	ctx, cancel := context.WithCancel(context.Background())
	cancel()
	require.ErrorIs(t, wait.Group(ctx, &wg), context.Canceled, "a group still running")
	wg.Done()
}

// Every calls at once, then on each period, and stops with its context.
func TestEvery(t *testing.T) {
	t.Parallel()
	ctx, cancel := context.WithCancel(context.Background())
	calls := 0
	wait.Every(ctx, time.Millisecond, func() {
		calls++
		if calls == 3 {
			cancel()
		}
	})
	require.Equal(t, 3, calls)

	calls = 0
	wait.Every(ctx, time.Hour, func() { calls++ })
	require.Equal(t, 1, calls, "the first call is at once, even with an ended context")
	wait.Ticks(ctx, time.Millisecond, func() { calls++ })
	require.Equal(t, 1, calls, "Ticks makes no call at once")
}

// Ticks calls on each period, from the first one on.
func TestTicks(t *testing.T) {
	t.Parallel()
	ctx, cancel := context.WithCancel(context.Background())
	start := time.Now()
	calls := 0
	wait.Ticks(ctx, 5*time.Millisecond, func() {
		calls++
		if calls == 1 {
			require.GreaterOrEqual(t, time.Since(start), 5*time.Millisecond, "the first call is one period on")
		}
		if calls == 2 {
			cancel()
		}
	})
	require.Equal(t, 2, calls)
}
