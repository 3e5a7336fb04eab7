package ingress

import (
	"fmt"
	"testing"
	"time"

	"github.com/stretchr/testify/require"
)

// The limiter keeps at most max callers, forgetting the least recently
// seen, and a caller's refusal says when to come back.
func TestCallerLimiterBounded(t *testing.T) {
	t.Parallel()
	now := time.Unix(1_700_000_000, 0)
	l := newCallerLimiter(0.5, 1, 3)
	ok, _ := l.allow("a", now)
	require.True(t, ok)
	ok, wait := l.allow("a", now)
	require.False(t, ok)
	require.Equal(t, 2*time.Second, wait, "one request per 2 s")
	ok, _ = l.allow("a", now.Add(2*time.Second))
	require.True(t, ok, "refilled")

	for i := range 10 {
		l.allow(fmt.Sprintf("c%d", i), now)
	}
	require.Equal(t, 3, l.len())
	// "a" was forgotten: it starts again with a full bucket.
	ok, _ = l.allow("a", now.Add(2*time.Second))
	require.True(t, ok)
	require.Equal(t, 3, l.len())
}
