package main

import (
	"fmt"
	"io"
	"math"
	"slices"
	"strings"
	"sync"
	"text/tabwriter"
	"time"
)

// latencies collects durations from many goroutines. Every sample is kept
// (a minute at 1,000/s is 60,000 of them), so percentiles are exact.
type latencies struct {
	mu sync.Mutex
	d  []time.Duration
}

func (l *latencies) add(d time.Duration) {
	l.mu.Lock()
	l.d = append(l.d, d)
	l.mu.Unlock()
}

func (l *latencies) summary() summary {
	l.mu.Lock()
	d := slices.Clone(l.d)
	l.mu.Unlock()
	return summarize(d)
}

// summary is the distribution of a set of durations.
type summary struct {
	N             int
	P50, P99, Max time.Duration
	Min           time.Duration
}

func summarize(d []time.Duration) summary {
	if len(d) == 0 {
		return summary{}
	}
	slices.Sort(d)
	return summary{N: len(d), Min: d[0], P50: percentile(d, 0.50), P99: percentile(d, 0.99), Max: d[len(d)-1]}
}

// percentile of sorted d, nearest rank.
func percentile(d []time.Duration, q float64) time.Duration {
	i := int(math.Ceil(q*float64(len(d)))) - 1
	return d[max(0, min(i, len(d)-1))]
}

// ms formats a duration in milliseconds with sensible precision.
func ms(d time.Duration) string {
	v := float64(d) / float64(time.Millisecond)
	switch {
	case d == 0:
		return "0 ms"
	case math.Abs(v) >= 10_000:
		return fmt.Sprintf("%.1f s", v/1000)
	case math.Abs(v) >= 100:
		return fmt.Sprintf("%.0f ms", v)
	case math.Abs(v) >= 10:
		return fmt.Sprintf("%.1f ms", v)
	}
	return fmt.Sprintf("%.2f ms", v)
}

// ratio is how many times better a is than b for a lower-is-better
// figure, e.g. "29x"; "-" when either is missing.
func ratioLower(a, b time.Duration) string {
	if a <= 0 || b <= 0 {
		return "-"
	}
	return fmtRatio(float64(b) / float64(a))
}

// ratioHigher is a/b for a higher-is-better figure.
func ratioHigher(a, b float64) string {
	if a <= 0 || b <= 0 {
		return "-"
	}
	return fmtRatio(a / b)
}

func fmtRatio(r float64) string {
	switch {
	case r >= 10:
		return fmt.Sprintf("%.0fx", r)
	case r >= 0.095:
		return fmt.Sprintf("%.2gx", r)
	}
	return fmt.Sprintf("%.2fx", r)
}

func count(n int) string {
	switch {
	case n >= 1_000_000 && n%1_000_000 == 0:
		return fmt.Sprintf("%dM", n/1_000_000)
	case n >= 1_000 && n%1_000 == 0:
		return fmt.Sprintf("%dk", n/1_000)
	}
	return fmt.Sprint(n)
}

func bytesIEC(b float64) string {
	switch {
	case b >= 1<<30:
		return fmt.Sprintf("%.2f GiB", b/(1<<30))
	case b >= 1<<20:
		return fmt.Sprintf("%.1f MiB", b/(1<<20))
	case b >= 1<<10:
		return fmt.Sprintf("%.1f KiB", b/(1<<10))
	}
	return fmt.Sprintf("%.0f B", b)
}

// table prints aligned columns.
type table struct {
	head []string
	rows [][]string
}

func newTable(head ...string) *table { return &table{head: head} }

func (t *table) row(cells ...string) { t.rows = append(t.rows, cells) }

func (t *table) print(w io.Writer) {
	tw := tabwriter.NewWriter(w, 0, 0, 2, ' ', 0)
	fmt.Fprintln(tw, strings.Join(t.head, "\t"))
	seps := make([]string, len(t.head))
	for i, h := range t.head {
		seps[i] = strings.Repeat("-", len(h))
	}
	fmt.Fprintln(tw, strings.Join(seps, "\t"))
	for _, r := range t.rows {
		fmt.Fprintln(tw, strings.Join(r, "\t"))
	}
	_ = tw.Flush()
}

// verdict says whether a figure meets its target, in words (no assertion
// anywhere: CI runs the suite as a smoke test only).
func verdict(ok bool) string {
	if ok {
		return "meets target"
	}
	return "MISSES target"
}
