package servicetest

import (
	"testing"
	"time"
)

// ClearOfWindowEdge returns once the next margin of wall-clock time stays
// inside one fixed window of length window (windows aligned on the Unix
// epoch, as source rate windows are). A test that fills a rate window and
// expects it to stay full would otherwise fail when it runs across the
// window's end, which for an hour window happens at every full hour. When
// the edge is nearer than margin it waits for the edge to pass: at most
// margin, in about margin/window of the runs.
func ClearOfWindowEdge(t testing.TB, window, margin time.Duration) {
	t.Helper()
	now := time.Now()
	ms := window.Milliseconds()
	end := time.UnixMilli((now.UnixMilli()/ms + 1) * ms)
	if end.Sub(now) > margin {
		return
	}
	t.Logf("waiting %s for the %s rate window to end, so the test runs inside one window", end.Sub(now).Round(time.Millisecond), window)
	time.Sleep(time.Until(end) + 10*time.Millisecond)
}
