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

func TestRetentionScenarioIsRegistered(t *testing.T) {
	t.Parallel()
	require.Contains(t, scenarios, "retention")
	require.Equal(t, 100_000, quickSizes().RetentionRows)
	require.Equal(t, 1_000_000, fullSizes().RetentionRows)
}

// The loaded old days are exactly the partitions whose range ends at or
// before now - retention (the ones retention drops), and the retained rows
// stay clear of that cutoff.
func TestRetentionLayoutDropsWholeOldDays(t *testing.T) {
	t.Parallel()
	now := time.Date(2026, 11, 26, 15, 4, 5, 0, time.UTC)
	l := newRetentionLayout(now, 30*24*time.Hour)
	cutoff := now.Add(-l.keep)
	days := l.droppedDays()
	require.Len(t, days, retentionDroppedDays)
	require.Equal(t, "retry_history_p20261026", dayPartName(days[0]))
	require.Equal(t, "retry_history_p20261024", dayPartName(days[2]))
	for _, d := range days {
		require.False(t, d.Add(24*time.Hour).After(cutoff), "%s ends after the cutoff", d)
	}
	require.True(t, l.oldEnd().Add(24*time.Hour).After(cutoff), "the day after the newest dropped one is kept")
	require.True(t, l.keptFrom().After(cutoff.Add(24*time.Hour)))
	require.Equal(t, time.Date(2026, 11, 26, 0, 0, 0, 0, time.UTC), l.keptTo())
}

func TestDueSamplesBetweenKeepsTheInterval(t *testing.T) {
	t.Parallel()
	t0 := time.Unix(1_700_000_000, 0)
	var d dueSamples
	for i := range 10 {
		due := t0.Add(time.Duration(i) * time.Second)
		d.add(dueSample{published: due.Add(-time.Second), due: due, late: time.Duration(i+1) * time.Millisecond,
			e2e: time.Duration(i+10) * time.Millisecond})
	}
	late, e2e := d.between(t0.Add(3*time.Second), t0.Add(5*time.Second), byDue)
	require.Equal(t, 3, late.N)
	require.Equal(t, 4*time.Millisecond, late.Min)
	require.Equal(t, 6*time.Millisecond, late.Max)
	require.Equal(t, 15*time.Millisecond, e2e.Max)
	late, _ = d.between(t0.Add(3*time.Second), t0.Add(5*time.Second), byReported)
	require.Equal(t, 5*time.Millisecond, late.Min, "reported at 3s: due at 4s")
	late, _ = d.between(t0.Add(-2*time.Second), t0.Add(-time.Second), byDue)
	require.Equal(t, summary{}, late)
}
