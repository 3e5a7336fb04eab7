package main

import "time"

// The per-cycle cost breakdown of the cycles scenario: counters read at the
// start and the end of the measured window (the one the cycles/s figure
// counts completions in), their differences summed over a system's runs
// and divided by the cycles completed in those windows.

// costMetric is one counter of the breakdown.
type costMetric int

const (
	costStatements  costMetric = iota // pg_stat_statements calls in the system's database
	costXacts                         // pg_stat_database xact_commit + xact_rollback
	costRowsWritten                   // pg_stat_database tup_inserted + tup_updated + tup_deleted
	costWALBytes                      // pg_current_wal_lsn, the whole server
	costJSMsgs                        // sum of the streams' last sequence
	costJSBytes                       // sum of the streams' stored bytes
	costNATSBytes                     // nats-server varz in_bytes + out_bytes, every connection
	costBenchCPU                      // clock ticks of the bench process (scheduler, NATS server, owner, River)
	costPostgresCPU                   // clock ticks of the postmaster and its children
	numCostMetrics
)

// counters is a reading of every metric; ok is false where a metric could
// not be read (no pg_stat_statements, no NATS for River, Postgres on
// another machine).
type counters struct {
	v  [numCostMetrics]int64
	ok [numCostMetrics]bool
}

func (c *counters) set(m costMetric, v int64) {
	c.v[m], c.ok[m] = v, true
}

// sub is the change from a to b. A counter that went backwards (a server
// reset its statistics) is unavailable rather than negative.
func (b counters) sub(a counters) counters {
	var d counters
	for i := range d.v {
		if a.ok[i] && b.ok[i] && b.v[i] >= a.v[i] {
			d.v[i], d.ok[i] = b.v[i]-a.v[i], true
		}
	}
	return d
}

// costRun is what one measured window cost.
type costRun struct {
	delta     counters
	dur       time.Duration
	completed int
	// cpuSplit is CPU time of the bench process by profiler label
	// (component), from the CPU profile of the window.
	cpuSplit map[string]time.Duration
}

// costTotal adds up a system's runs.
type costTotal struct {
	delta     counters
	dur       time.Duration
	completed int
	cpuSplit  map[string]time.Duration
	splitRuns int // runs that had a profile
	runs      int
}

// add sums r into t. A metric is available in the total only if it was in
// every run: a sum over some of the runs divided by all the cycles would
// understate it.
func (t *costTotal) add(r costRun) {
	if t.runs == 0 {
		t.delta.ok = r.delta.ok
	}
	for i := range t.delta.v {
		t.delta.v[i] += r.delta.v[i]
		t.delta.ok[i] = t.delta.ok[i] && r.delta.ok[i]
	}
	t.dur += r.dur
	t.completed += r.completed
	t.runs++
	if r.cpuSplit != nil {
		t.splitRuns++
		if t.cpuSplit == nil {
			t.cpuSplit = map[string]time.Duration{}
		}
		for k, v := range r.cpuSplit {
			t.cpuSplit[k] += v
		}
	}
}

// perCycle is metric m divided by the completed cycles; false when it is
// unavailable or no cycle completed.
func (t costTotal) perCycle(m costMetric) (float64, bool) {
	if !t.delta.ok[m] || t.completed <= 0 {
		return 0, false
	}
	return float64(t.delta.v[m]) / float64(t.completed), true
}

// cpuPerCycle is a CPU metric (clock ticks at hz) per completed cycle.
func (t costTotal) cpuPerCycle(m costMetric, hz int) (time.Duration, bool) {
	if !t.delta.ok[m] || t.completed <= 0 || hz <= 0 {
		return 0, false
	}
	return ticksToDuration(uint64(t.delta.v[m]), hz) / time.Duration(t.completed), true
}

// splitPerCycle shares the bench process's CPU per cycle (from /proc) out
// by the profile's shares of its samples: the profile samples at 100 Hz
// and misses some time, /proc counts all of it, so the shares are the
// profile's and the total is /proc's.
func (t costTotal) splitPerCycle(hz int) (map[string]time.Duration, bool) {
	perCycle, ok := t.cpuPerCycle(costBenchCPU, hz)
	if !ok || t.splitRuns != t.runs || len(t.cpuSplit) == 0 {
		return nil, false
	}
	var sum time.Duration
	for _, v := range t.cpuSplit {
		sum += v
	}
	if sum <= 0 {
		return nil, false
	}
	out := make(map[string]time.Duration, len(t.cpuSplit))
	for k, v := range t.cpuSplit {
		out[k] = time.Duration(float64(perCycle) * float64(v) / float64(sum))
	}
	return out, true
}

// coresBusy is the CPU metric m as cores kept busy on average over the
// windows, which says how close the run came to the machine's limit.
func (t costTotal) coresBusy(m costMetric, hz int) (float64, bool) {
	if !t.delta.ok[m] || t.dur <= 0 || hz <= 0 {
		return 0, false
	}
	return ticksToDuration(uint64(t.delta.v[m]), hz).Seconds() / t.dur.Seconds(), true
}
