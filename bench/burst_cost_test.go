package main

import (
	"bytes"
	"strings"
	"testing"
	"time"
)

func TestBurstCostPrint(t *testing.T) {
	hz, _ := clockTicks()
	var d counters
	// 2 s of bench-process CPU and 1 s of Postgres CPU over a 2 s window,
	// for 1,000 dues: 1.00 and 0.50 cores busy, 1 ms of Postgres a due.
	d.set(costBenchCPU, int64(2*hz))
	d.set(costPostgresCPU, int64(hz))
	d.set(costRowsWritten, 2000)
	d.set(costWALBytes, 500_000)
	c := &burstCost{run: costRun{delta: d, dur: 2 * time.Second, completed: 1000, cpuSplit: map[string]time.Duration{
		compScheduler: 3 * time.Second, compNATS: time.Second,
	}}, notes: []string{"a note"}}
	var out bytes.Buffer
	rec := &recorder{}
	c.print(&out, rec, 1000)
	got := out.String()
	for _, want := range []string{
		"1.00 cores busy in the bench process", "0.50 in Postgres, 1.50 of this machine's",
		"scheduler 1500.0 µs", "nats-server 500.0 µs", "bench owner 0.0 µs", "Postgres 1000.0 µs",
		"2.00 Postgres rows written, 500 WAL bytes", "(a note)",
	} {
		if !strings.Contains(got, want) {
			t.Errorf("print lacks %q:\n%s", want, got)
		}
	}
	metrics := map[string]float64{}
	for _, r := range rec.all() {
		metrics[r.Metric] = r.Value
	}
	if metrics["cpu_per_due_scheduler"] != 1500 || metrics["cores_postgres"] != 0.5 {
		t.Errorf("records %v", metrics)
	}
}

func TestBurstCostPrintWithoutFigures(t *testing.T) {
	var out bytes.Buffer
	(&burstCost{notes: []string{"cost probe: refused"}}).print(&out, nil, 10)
	if got := out.String(); got != "  (cost probe: refused)\n" {
		t.Fatalf("print = %q", got)
	}
	var nilCost *burstCost
	nilCost.print(&out, nil, 10) // River and the others have none
}

func TestRunOrder(t *testing.T) {
	if got := runOrder(4); got != "A B C D D C B A" {
		t.Fatalf("runOrder(4) = %q", got)
	}
}
