package main

import (
	"testing"
	"time"

	"github.com/stretchr/testify/require"
	"gonum.org/v1/plot/plotter"
)

// The bench asserts no timing; these tests check the arithmetic its
// tables rest on.

func TestSummarizeUsesNearestRank(t *testing.T) {
	t.Parallel()
	d := make([]time.Duration, 0, 100)
	for i := 100; i >= 1; i-- { // unsorted on purpose
		d = append(d, time.Duration(i)*time.Millisecond)
	}
	s := summarize(d)
	require.Equal(t, 100, s.N)
	require.Equal(t, time.Millisecond, s.Min)
	require.Equal(t, 50*time.Millisecond, s.P50)
	require.Equal(t, 99*time.Millisecond, s.P99)
	require.Equal(t, 100*time.Millisecond, s.Max)
	require.Equal(t, summary{}, summarize(nil))
}

func TestPendingRowsDueByMatchesDueAt(t *testing.T) {
	t.Parallel()
	p := pendingRows{kind: "bg", n: 1000, from: time.Unix(1_700_000_000, 0), span: time.Hour}
	require.Equal(t, 0, p.dueBy(p.from.Add(-time.Second)))
	require.Equal(t, p.n, p.dueBy(p.from.Add(2*time.Hour)))
	for _, i := range []int{0, 1, 499, 998, 999} {
		at := p.dueAt(i)
		require.Equal(t, i+1, p.dueBy(at), "slot %d is due at %s", i, at)
		require.Equal(t, i, p.dueBy(at.Add(-time.Millisecond)), "slot %d is not due just before %s", i, at)
	}
	require.Equal(t, "bg-42", p.id(42))
}

func TestItemIDCarriesTheReportTime(t *testing.T) {
	t.Parallel()
	at := time.Unix(1_700_000_000, 123_456_789)
	id := itemID("p", at, 77)
	require.Regexp(t, `^[A-Za-z0-9_-]+$`, id)
	require.True(t, itemTime(id).Equal(at))
	require.True(t, itemTime("bg-1").IsZero())
}

func TestSteadyAfterFindsTheLastBadWindow(t *testing.T) {
	t.Parallel()
	restart := time.Unix(1_700_000_000, 0)
	var rs []receipt
	add := func(after, late time.Duration) {
		at := restart.Add(after)
		rs = append(rs, receipt{at: at, dueAt: at.Add(-late)})
	}
	add(-time.Second, 5*time.Second) // before the restart: ignored
	add(100*time.Millisecond, 2*time.Second)
	add(600*time.Millisecond, 300*time.Millisecond) // window 2 is still late
	add(800*time.Millisecond, 10*time.Millisecond)
	add(1100*time.Millisecond, 20*time.Millisecond)
	steady, worst := steadyAfter(rs, restart, restart.Add(2*time.Second), 100*time.Millisecond)
	require.Equal(t, 750*time.Millisecond, steady)
	require.Equal(t, 2*time.Second, worst)

	add(1900*time.Millisecond, time.Second) // late at the very end: never steady
	steady, _ = steadyAfter(rs, restart, restart.Add(2*time.Second), 100*time.Millisecond)
	require.Equal(t, time.Duration(-1), steady)
}

func TestParseInts(t *testing.T) {
	t.Parallel()
	got, err := parseInts("10000, 100_000,1000000")
	require.NoError(t, err)
	require.Equal(t, []int{10_000, 100_000, 1_000_000}, got)
	_, err = parseInts("10k")
	require.Error(t, err)
	_, err = parseInts("-1")
	require.Error(t, err)
}

func TestMergeByXKeepsTheWorstOfEachSize(t *testing.T) {
	t.Parallel()
	got := mergeByX(plotter.XYs{{X: 100, Y: 5}, {X: 10, Y: 1}, {X: 100, Y: 9}, {X: 10, Y: 2}})
	require.Equal(t, plotter.XYs{{X: 10, Y: 2}, {X: 100, Y: 9}}, got)
}

func TestRatios(t *testing.T) {
	t.Parallel()
	require.Equal(t, "29x", ratioLower(41*time.Millisecond, 1200*time.Millisecond))
	require.Equal(t, "0.5x", ratioHigher(1, 2))
	require.Equal(t, "-", ratioHigher(0, 2))
	require.Equal(t, "-", ratioLower(0, time.Second))
}

func TestLongestIncreasingCountsWhatIsInPlace(t *testing.T) {
	for _, c := range []struct {
		seq  []int
		want int
	}{
		{nil, 0},
		{[]int{0, 1, 2, 3}, 4},
		{[]int{3, 2, 1, 0}, 1},
		{[]int{0, 2, 1, 3, 4}, 4}, // one event out of place
		{[]int{4, 0, 1, 2, 3}, 4}, // one event far ahead of its place
	} {
		require.Equal(t, c.want, longestIncreasing(c.seq), "%v", c.seq)
	}
}
