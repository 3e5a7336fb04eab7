package contract_test

import (
	"fmt"
	"testing"
	"time"

	"github.com/stretchr/testify/require"

	"github.com/retryd/retryd/pkg/contract"
)

func TestReleasePaceSlots(t *testing.T) {
	t.Parallel()
	from := time.Date(2026, 11, 25, 12, 0, 0, 0, time.UTC)
	// 3 per second: slots 333,333 µs apart, each window from its start.
	p := contract.ReleasePace{From: from, Skip: 1, Limit: 3, WindowMS: 1000}
	require.NoError(t, p.Validate())
	want := []time.Duration{333333 * time.Microsecond, 666666 * time.Microsecond, time.Second, time.Second + 333333*time.Microsecond}
	for i, d := range want {
		require.True(t, p.SlotAt(i).Equal(from.Add(d)), "slot %d: %s", i, p.SlotAt(i))
	}
	// Never more than the limit in a window, and in order.
	perWindow := map[int64]int{}
	for i := range 1000 {
		at := p.SlotAt(i)
		if i > 0 {
			require.True(t, at.After(p.SlotAt(i-1)))
		}
		perWindow[at.Sub(from).Milliseconds()/1000]++
	}
	for w, n := range perWindow {
		limit := 3
		if w == 0 {
			limit -= p.Skip
		}
		require.LessOrEqual(t, n, limit, "window %d", w)
	}
	require.Equal(t, time.Microsecond, contract.SlotSpacing(time.Millisecond, 10_000), "at least a microsecond")

	// Dues come at the start of the 10 ms that holds the slot, never after
	// it, never in another window.
	fast := contract.ReleasePace{From: from, Limit: 10_000, WindowMS: 1000}
	for _, p := range []contract.ReleasePace{fast, p, {From: from, Skip: 7, Limit: 7_919, WindowMS: 1000}, {From: from, Limit: 300, WindowMS: 60_000}} {
		for i := range 3 * p.Limit {
			slot, due := p.SlotAt(i), p.DueAt(i)
			require.False(t, due.After(slot), "rank %d", i)
			require.Less(t, slot.Sub(due), contract.PaceQuantum, "rank %d", i)
			require.Equal(t, slot.Sub(from)/p.Window(), due.Sub(from)/p.Window(), "rank %d: same window", i)
			if i > 0 {
				require.True(t, due.After(p.DueAt(i-1)), "rank %d: in rank order", i)
			}
		}
	}
	require.True(t, fast.DueAt(150).Equal(from.Add(10*time.Millisecond+50*time.Microsecond)), "the quantum's start, then its place in it")
	short := contract.ReleasePace{From: from, Limit: 4, WindowMS: 5}
	require.True(t, short.DueAt(5).Equal(from.Add(5*time.Millisecond+time.Microsecond)), "a window shorter than the quantum: at its start, then its place")
}

// A release paced at a source's limit of 10,000 a second: the scheduler
// brings item i back at SlotAt(i).
func ExampleReleasePace() {
	p := contract.ReleasePace{From: time.Date(2026, 11, 25, 12, 0, 0, 0, time.UTC), Limit: 10_000, WindowMS: 1000}
	for _, i := range []int{0, 1, 9_999, 10_000, 25_000} {
		fmt.Println(i, p.SlotAt(i).Format("15:04:05.000000"))
	}
	// Output:
	// 0 12:00:00.000000
	// 1 12:00:00.000100
	// 9999 12:00:00.999900
	// 10000 12:00:01.000000
	// 25000 12:00:02.500000
}
