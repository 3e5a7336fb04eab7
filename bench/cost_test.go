package main

import (
	"encoding/binary"
	"testing"
	"time"

	"github.com/google/pprof/profile"
)

func TestParseProcStat(t *testing.T) {
	// A command name with spaces and parentheses: fields count from the
	// last ')'.
	line := "4242 (postgres: bench (x) ) S 17 4242 4242 0 -1 4194560 100 0 0 0 " +
		"1234 567 89 10 20 0 1 0 5000 100000 200 18446744073709551615 1 1 0 0 0 0 0 0 0 0 0 0 17 1 0 0 0 0 0\n"
	st, err := parseProcStat([]byte(line))
	if err != nil {
		t.Fatal(err)
	}
	want := procStat{pid: 4242, ppid: 17, utime: 1234, stime: 567, cutime: 89, cstime: 10}
	if st != want {
		t.Fatalf("got %+v, want %+v", st, want)
	}
	if st.ownTicks() != 1801 {
		t.Fatalf("ownTicks %d, want 1801", st.ownTicks())
	}
}

func TestParseProcStatRejects(t *testing.T) {
	for _, line := range []string{
		"",
		"12 no-parens S 1",
		"12 (short) S 1 2 3",
		"x (bad pid) S 1 1 1 0 -1 0 0 0 0 0 1 1 1 1 20 0 1 0",
		"12 (neg) S 1 1 1 0 -1 0 0 0 0 0 1 1 -1 1 20 0 1 0",
	} {
		if _, err := parseProcStat([]byte(line)); err == nil {
			t.Errorf("parseProcStat(%q) accepted", line)
		}
	}
}

func TestReadOwnProcStat(t *testing.T) {
	st, err := readProcStat(1)
	if err != nil {
		t.Skipf("no /proc here: %v", err)
	}
	if st.pid != 1 {
		t.Fatalf("pid %d, want 1", st.pid)
	}
}

func TestTreeTicks(t *testing.T) {
	pm := procStat{utime: 10, stime: 5, cutime: 100, cstime: 50}
	kids := []procStat{{utime: 1, stime: 2}, {utime: 3, stime: 4, cutime: 1000}}
	// A child's own cutime is its children's, already reaped by it, not
	// by the postmaster: only utime+stime of live children count.
	if got := treeTicks(pm, kids); got != 10+5+100+50+1+2+3+4 {
		t.Fatalf("treeTicks %d", got)
	}
}

func TestAuxvClockTicks(t *testing.T) {
	var b []byte
	for _, kv := range [][2]uint64{{6, 4096}, {atClkTck, 250}, {0, 0}} {
		b = binary.LittleEndian.AppendUint64(b, kv[0])
		b = binary.LittleEndian.AppendUint64(b, kv[1])
	}
	if hz, ok := auxvClockTicks(b); !ok || hz != 250 {
		t.Fatalf("got %d %v, want 250", hz, ok)
	}
	if _, ok := auxvClockTicks(b[:16]); ok {
		t.Fatal("found AT_CLKTCK in a vector without it")
	}
}

func TestCountersSub(t *testing.T) {
	var a, b counters
	a.set(costStatements, 100)
	b.set(costStatements, 130)
	a.set(costWALBytes, 500)
	b.set(costWALBytes, 400) // reset: unavailable, not negative
	b.set(costJSMsgs, 7)     // missing at the start
	d := b.sub(a)
	if !d.ok[costStatements] || d.v[costStatements] != 30 {
		t.Fatalf("statements %d %v", d.v[costStatements], d.ok[costStatements])
	}
	if d.ok[costWALBytes] || d.ok[costJSMsgs] || d.ok[costXacts] {
		t.Fatalf("unavailable metrics reported: %v", d.ok)
	}
}

func TestCostTotalPerCycle(t *testing.T) {
	run := func(stmts, ticks int64, completed int, split map[string]time.Duration) costRun {
		var d counters
		d.set(costStatements, stmts)
		d.set(costBenchCPU, ticks)
		return costRun{delta: d, dur: 10 * time.Second, completed: completed, cpuSplit: split}
	}
	var tot costTotal
	tot.add(run(300, 100, 100, map[string]time.Duration{"a": 3, "b": 1}))
	tot.add(run(100, 300, 300, map[string]time.Duration{"a": 1, "b": 3}))
	if v, ok := tot.perCycle(costStatements); !ok || v != 1 {
		t.Fatalf("statements per cycle %v %v, want 1", v, ok)
	}
	// 400 ticks at 100 Hz = 4 s over 400 cycles = 10 ms a cycle.
	if d, ok := tot.cpuPerCycle(costBenchCPU, 100); !ok || d != 10*time.Millisecond {
		t.Fatalf("cpu per cycle %v %v", d, ok)
	}
	split, ok := tot.splitPerCycle(100)
	if !ok || split["a"] != 5*time.Millisecond || split["b"] != 5*time.Millisecond {
		t.Fatalf("split %v %v", split, ok)
	}
	// 4 s of CPU over 20 s of windows.
	if c, ok := tot.coresBusy(costBenchCPU, 100); !ok || c != 0.2 {
		t.Fatalf("cores busy %v %v", c, ok)
	}
	if _, ok := tot.perCycle(costWALBytes); ok {
		t.Fatal("WAL reported though never measured")
	}
}

func TestCostTotalNeedsEveryRun(t *testing.T) {
	var with, without counters
	with.set(costStatements, 10)
	var tot costTotal
	tot.add(costRun{delta: with, completed: 10, cpuSplit: map[string]time.Duration{"a": 1}})
	tot.add(costRun{delta: without, completed: 10})
	if _, ok := tot.perCycle(costStatements); ok {
		t.Fatal("a metric missing from one run reported for both")
	}
	if _, ok := tot.splitPerCycle(100); ok {
		t.Fatal("a split missing from one run reported for both")
	}
}

func TestCostPerCycleNoCycles(t *testing.T) {
	var d counters
	d.set(costStatements, 10)
	var tot costTotal
	tot.add(costRun{delta: d})
	if _, ok := tot.perCycle(costStatements); ok {
		t.Fatal("per-cycle figure without cycles")
	}
}

func TestCPUByLabel(t *testing.T) {
	natsFn := &profile.Function{ID: 1, Name: "github.com/nats-io/nats-server/v2/server.(*fileStore).storeRawMsg"}
	gcFn := &profile.Function{ID: 2, Name: "runtime.gcBgMarkWorker"}
	natsLoc := &profile.Location{ID: 1, Line: []profile.Line{{Function: natsFn}}}
	gcLoc := &profile.Location{ID: 2, Line: []profile.Line{{Function: gcFn}}}
	prof := &profile.Profile{
		SampleType: []*profile.ValueType{{Type: "samples", Unit: "count"}, {Type: "cpu", Unit: "nanoseconds"}},
		Sample: []*profile.Sample{
			{Value: []int64{1, 10}, Location: []*profile.Location{gcLoc}, Label: map[string][]string{componentLabel: {compScheduler}}},
			{Value: []int64{1, 20}, Location: []*profile.Location{natsLoc}, Label: map[string][]string{"stream": {"RETRIES"}}},
			{Value: []int64{1, 30}, Location: []*profile.Location{gcLoc}},
			{Value: []int64{1, 5}, Location: []*profile.Location{natsLoc}, Label: map[string][]string{componentLabel: {compNATS}}},
		},
	}
	got, err := cpuByLabel(prof)
	if err != nil {
		t.Fatal(err)
	}
	want := map[string]time.Duration{compScheduler: 10, compNATS: 25, compRuntime: 30}
	if len(got) != len(want) {
		t.Fatalf("got %v, want %v", got, want)
	}
	for k, v := range want {
		if got[k] != v {
			t.Fatalf("got %v, want %v", got, want)
		}
	}
}
