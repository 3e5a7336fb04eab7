// Command bench measures retryd and the tools a user would pick instead of
// it, on the same machine in the same run, and prints the figures.
//
// Each scenario lives in its own file and registers itself with register;
// `bench list` shows them, `bench run NAME...` runs some, `bench all` runs
// every one. --quick shrinks every scenario so the whole set runs in a few
// minutes (CI uses it as a smoke test; it asserts no timing). `bench plot
// RESULTS OUT.png` draws the lateness plot from a --json results file.
//
// All systems run on one machine in one run: one Postgres server (a
// database per system), an embedded nats-server per system run, and the
// owners, producers and in-process libraries in this process. Figures are
// printed as tables with ratios to the peers and to retryd's targets; see
// docs/benchmarks.md.
package main

import (
	"context"
	"errors"
	"flag"
	"fmt"
	"os"
	"os/signal"
	"runtime/pprof"
	"sort"
	"strings"
	"syscall"
	"time"
)

// Env is what every scenario gets: the flags and where to write.
type Env struct {
	Quick bool
	// DatabaseURL is an admin URL of a Postgres server; scenarios create
	// their own databases on it. Empty means start a throwaway cluster.
	DatabaseURL string
	Out         *os.File
	// NATSSync is the sync_interval of every embedded nats-server.
	NATSSync natsSync
	// SchedulerBin is the retryd-scheduler binary run as a child process
	// (recovery, memory); empty means build it with the go command.
	SchedulerBin string
	Sizes        sizes
	// CyclesProfile prefixes the files cycles writes the CPU profile of
	// each system run's measured window to (PREFIX-SYSTEM-runN.pprof);
	// "" writes none.
	CyclesProfile string

	cycleRun int // the cycles run under way (1-based), to name its profile

	pg   *pgServer // the run's Postgres, started before the first scenario
	rec  *recorder // figures for --json and --plot
	only []string  // --systems; empty means all
}

// runs reports whether system is to be run (--systems).
func (e Env) runs(system string) bool {
	if len(e.only) == 0 {
		return true
	}
	for _, s := range e.only {
		if strings.EqualFold(s, system) {
			return true
		}
	}
	return false
}

func splitList(s string) []string {
	var out []string
	for _, p := range strings.Split(s, ",") {
		if p = strings.TrimSpace(p); p != "" {
			out = append(out, p)
		}
	}
	return out
}

type scenario struct {
	name, help string
	run        func(ctx context.Context, env Env) error
}

var scenarios = map[string]scenario{}

func register(name, help string, run func(ctx context.Context, env Env) error) {
	if _, dup := scenarios[name]; dup {
		panic("bench: scenario registered twice: " + name)
	}
	scenarios[name] = scenario{name: name, help: help, run: run}
}

func main() {
	os.Exit(run())
}

func run() int {
	fs := flag.NewFlagSet("bench", flag.ContinueOnError)
	quick := fs.Bool("quick", false, "small sizes and short durations (smoke test, a few minutes in all)")
	dbURL := fs.String("database-url", os.Getenv("BENCH_DATABASE_URL"), "admin URL of a Postgres server to use (default: start a throwaway cluster with default durability)")
	syncCommit := fs.String("synchronous-commit", "", "set synchronous_commit on every bench database (on, off, ...; default: the server's)")
	natsSyncFlag := fs.String("nats-sync", "default", "sync_interval of the embedded nats-servers: default (2m), always, or a duration")
	schedBin := fs.String("scheduler-bin", os.Getenv("BENCH_SCHEDULER_BIN"), "retryd-scheduler binary for recovery and memory (default: go build it)")
	only := fs.String("systems", "", "run only these systems, comma separated (e.g. retryd,River); default all")
	cyclesProfile := fs.String("cycles-profile", "", "cycles: write the CPU profile of each run's measured window to PREFIX-SYSTEM-runN.pprof")
	cpuProfile := fs.String("cpuprofile", "", "write a CPU profile of the bench process (in-process systems included) here")
	jsonOut := fs.String("json", "", "append every figure to this file as JSON lines")
	plotOut := fs.String("plot", "", "write the lateness plot (PNG) here after the run")
	sf := registerSizeFlags(fs)
	fs.Usage = func() {
		fmt.Fprintln(fs.Output(), "usage: bench [flags] list | all | run NAME... | plot RESULTS.jsonl OUT.png")
		fs.PrintDefaults()
	}
	if err := fs.Parse(os.Args[1:]); err != nil {
		return 2
	}
	sz := fullSizes()
	if *quick {
		sz = quickSizes()
	}
	if err := sf.apply(&sz); err != nil {
		fmt.Fprintln(os.Stderr, "bench:", err)
		return 2
	}
	if err := natsSync(*natsSyncFlag).validate(); err != nil {
		fmt.Fprintln(os.Stderr, "bench:", err)
		return 2
	}
	args := fs.Args()
	if len(args) == 0 {
		fs.Usage()
		return 2
	}
	names := sortedNames()
	switch args[0] {
	case "list":
		for _, n := range names {
			fmt.Printf("%-24s %s\n", n, scenarios[n].help)
		}
		return 0
	case "all":
	case "plot":
		if len(args) != 3 {
			fmt.Fprintln(os.Stderr, "bench plot: want RESULTS.jsonl OUT.png")
			return 2
		}
		recs, err := readJSONLines(args[1])
		if err == nil {
			err = writeLatenessPlot(args[2], recs)
		}
		if err != nil {
			fmt.Fprintln(os.Stderr, "bench plot:", err)
			return 1
		}
		return 0
	case "run":
		if len(args) < 2 {
			fmt.Fprintln(os.Stderr, "bench run: name at least one scenario (bench list shows them)")
			return 2
		}
		names = args[1:]
		for _, n := range names {
			if _, ok := scenarios[n]; !ok {
				fmt.Fprintf(os.Stderr, "bench: unknown scenario %q (bench list shows them)\n", n)
				return 2
			}
		}
	default:
		fs.Usage()
		return 2
	}
	ctx, stop := signal.NotifyContext(context.Background(), os.Interrupt, syscall.SIGTERM)
	defer stop()
	env := Env{
		Quick: *quick, DatabaseURL: *dbURL, Out: os.Stdout, NATSSync: natsSync(*natsSyncFlag),
		SchedulerBin: *schedBin, Sizes: sz, CyclesProfile: *cyclesProfile, only: splitList(*only),
		rec: &recorder{run: map[string]any{
			"quick": *quick, "nats_sync": *natsSyncFlag, "synchronous_commit": *syncCommit,
			"scheduler_batch_size":    os.Getenv("RETRYD_SCHEDULER_BATCH_SIZE"),
			"scheduler_consume_batch": os.Getenv("RETRYD_SCHEDULER_CONSUME_BATCH"),
		}},
	}
	if *cpuProfile != "" {
		f, err := os.Create(*cpuProfile)
		if err != nil {
			fmt.Fprintln(os.Stderr, "bench:", err)
			return 1
		}
		defer f.Close()
		if err := pprof.StartCPUProfile(f); err != nil {
			fmt.Fprintln(os.Stderr, "bench:", err)
			return 1
		}
		defer pprof.StopCPUProfile()
	}
	defer cleanupDirs.removeAll()
	pg, err := startPostgres(ctx, *dbURL, *syncCommit)
	if err != nil {
		fmt.Fprintln(os.Stderr, "bench:", err)
		return 1
	}
	defer pg.stop(context.WithoutCancel(ctx))
	env.pg = pg
	printHeader(ctx, env, names)
	started := time.Now()
	failed := 0
	for _, n := range names {
		fmt.Printf("\n== %s\n", n)
		t0 := time.Now()
		err := scenarios[n].run(ctx, env)
		fmt.Printf("(%s took %s; load average now %s)\n", n, time.Since(t0).Round(time.Second), loadAvg())
		if err != nil {
			if errors.Is(err, context.Canceled) {
				return 1
			}
			fmt.Fprintf(os.Stderr, "bench %s: %v\n", n, err)
			failed++
		}
	}
	fmt.Printf("\nbench: %d scenario(s) in %s, %d failed\n", len(names), time.Since(started).Round(time.Second), failed)
	if *jsonOut != "" {
		if err := writeJSONLines(*jsonOut, env.rec.all()); err != nil {
			fmt.Fprintln(os.Stderr, "bench:", err)
			failed++
		}
	}
	if *plotOut != "" {
		if err := writeLatenessPlot(*plotOut, env.rec.all()); err != nil {
			fmt.Fprintln(os.Stderr, "bench:", err)
			failed++
		}
	}
	if failed > 0 {
		return 1
	}
	return 0
}

func sortedNames() []string {
	names := make([]string, 0, len(scenarios))
	for n := range scenarios {
		names = append(names, n)
	}
	sort.Strings(names)
	return names
}
