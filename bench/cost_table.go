package main

import (
	"fmt"
	"slices"
	"time"
)

// costRow is one line of the per-cycle cost table.
type costRow struct {
	label  string
	metric string // record name: cost_METRIC_per_cycle, or cost_METRIC when unit is cores
	unit   string
	value  func(t costTotal) (float64, bool)
	format func(v float64) string
}

// River's statements and transactions are well under one per cycle (it
// works jobs in sets), so small figures get more digits.
func countFmt(v float64) string {
	if v < 0.1 {
		return fmt.Sprintf("%.4f", v)
	}
	return fmt.Sprintf("%.2f", v)
}

func bytesFmt(v float64) string { return fmt.Sprintf("%.0f B", v) }

func msFmt(v float64) string {
	if v < 0.01 {
		return fmt.Sprintf("%.4f ms", v)
	}
	return fmt.Sprintf("%.3f ms", v)
}

func perCycleRow(label, metric, unit string, m costMetric, format func(float64) string) costRow {
	return costRow{label: label, metric: metric, unit: unit, format: format,
		value: func(t costTotal) (float64, bool) { return t.perCycle(m) }}
}

func cpuRow(label, metric string, m costMetric, hz int) costRow {
	return costRow{label: label, metric: metric, unit: "ms", format: msFmt,
		value: func(t costTotal) (float64, bool) {
			d, ok := t.cpuPerCycle(m, hz)
			return float64(d) / float64(time.Millisecond), ok
		}}
}

func splitRow(component, metric string, hz int) costRow {
	return costRow{label: "  of which " + component, metric: metric, unit: "ms", format: msFmt,
		value: func(t costTotal) (float64, bool) {
			split, ok := t.splitPerCycle(hz)
			d, has := split[component]
			return float64(d) / float64(time.Millisecond), ok && has
		}}
}

func totalCPURow(hz int) costRow {
	return costRow{label: "CPU, all of the above", metric: "cpu_total", unit: "ms", format: msFmt,
		value: func(t costTotal) (float64, bool) {
			a, ok1 := t.cpuPerCycle(costBenchCPU, hz)
			b, ok2 := t.cpuPerCycle(costPostgresCPU, hz)
			return float64(a+b) / float64(time.Millisecond), ok1 && ok2
		}}
}

func busyRow(label, metric string, m costMetric, hz int) costRow {
	return costRow{label: label, metric: metric, unit: "cores", format: func(v float64) string { return fmt.Sprintf("%.2f", v) },
		value: func(t costTotal) (float64, bool) { return t.coresBusy(m, hz) }}
}

// costSystems orders the systems of the table: retryd, River, the rest.
func costSystems(costs map[string]*costTotal) []string {
	var names []string
	for n := range costs {
		names = append(names, n)
	}
	rank := func(n string) int {
		switch n {
		case "retryd":
			return 0
		case "River":
			return 1
		}
		return 2
	}
	slices.SortFunc(names, func(a, b string) int {
		if d := rank(a) - rank(b); d != 0 {
			return d
		}
		if a < b {
			return -1
		}
		return 1
	})
	return names
}

// printCycleCost prints the per-cycle cost of each system and records it.
func printCycleCost(env Env, costs map[string]*costTotal) {
	if len(costs) == 0 {
		return
	}
	hz, read := clockTicks()
	rows := []costRow{
		perCycleRow("SQL statements (pg_stat_statements calls)", "statements", "1", costStatements, countFmt),
		perCycleRow("transactions (commits + rollbacks)", "transactions", "1", costXacts, countFmt),
		perCycleRow("rows written (inserted + updated + deleted)", "rows_written", "1", costRowsWritten, countFmt),
		perCycleRow("WAL bytes (whole server)", "wal_bytes", "B", costWALBytes, bytesFmt),
		perCycleRow("JetStream messages stored", "js_messages", "1", costJSMsgs, countFmt),
		perCycleRow("JetStream bytes stored", "js_bytes", "B", costJSBytes, bytesFmt),
		perCycleRow("NATS bytes in + out (all connections)", "nats_bytes", "B", costNATSBytes, bytesFmt),
		cpuRow("CPU, bench process (/proc)", "cpu_bench", costBenchCPU, hz),
		splitRow(compScheduler, "cpu_scheduler", hz),
		splitRow(compNATS, "cpu_nats_server", hz),
		splitRow(compRiver, "cpu_river_client", hz),
		splitRow(compOwner, "cpu_owner", hz),
		splitRow(compRuntime, "cpu_runtime", hz),
		cpuRow("CPU, Postgres (postmaster and children)", "cpu_postgres", costPostgresCPU, hz),
		totalCPURow(hz),
		busyRow("cores busy, bench process (not per cycle)", "cores_bench", costBenchCPU, hz),
		busyRow("cores busy, Postgres (not per cycle)", "cores_postgres", costPostgresCPU, hz),
	}
	names := costSystems(costs)
	head := append([]string{"per completed cycle"}, names...)
	_, hasRetryd := costs["retryd"]
	_, hasRiver := costs["River"]
	ratio := hasRetryd && hasRiver
	if ratio {
		head = append(head, "retryd / River")
	}
	t := newTable(head...)
	cycles := []string{"cycles in the measured windows"}
	for _, n := range names {
		c := costs[n]
		cycles = append(cycles, fmt.Sprintf("%d in %s", c.completed, c.dur.Round(time.Second)))
	}
	if ratio {
		cycles = append(cycles, "")
	}
	t.row(cycles...)
	for _, r := range rows {
		cells := []string{r.label}
		seen := false
		vals := map[string]float64{}
		oks := map[string]bool{}
		for _, n := range names {
			v, ok := r.value(*costs[n])
			vals[n], oks[n] = v, ok
			if !ok {
				cells = append(cells, "-")
				continue
			}
			seen = true
			cells = append(cells, r.format(v))
			name := "cost_" + r.metric + "_per_cycle"
			if r.unit == "cores" {
				name = "cost_" + r.metric
			}
			env.rec.add("cycles", n, name, v, r.unit, map[string]any{"cycles": costs[n].completed, "seconds": costs[n].dur.Seconds()})
		}
		if !seen {
			continue
		}
		if ratio {
			cell := "-"
			if oks["retryd"] && oks["River"] && vals["River"] > 0 {
				cell = fmtRatio(vals["retryd"] / vals["River"])
			}
			cells = append(cells, cell)
		}
		t.row(cells...)
	}
	fmt.Fprintln(env.Out, "\nper-cycle cost, measured windows only (- = not measured or none):")
	t.print(env.Out)
	how := "read from AT_CLKTCK"
	if !read {
		how = "assumed: AT_CLKTCK not readable"
	}
	fmt.Fprintf(env.Out, "CPU from /proc at %d ticks/s (%s); the bench process's split is its CPU profile's shares by component label;\n", hz, how)
	fmt.Fprintln(env.Out, "Postgres and WAL are the whole server's, which runs one system at a time; statements, transactions and rows are the system's database's.")
}
