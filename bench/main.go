// Command bench measures retryd and the tools a user would pick instead of
// it, on the same machine in the same run, and prints the figures.
//
// Each scenario lives in its own file and registers itself with register;
// `bench list` shows them, `bench run NAME...` runs some, `bench all` runs
// every one. --quick shrinks every scenario so the whole set runs in a few
// minutes (CI uses it as a smoke test; it asserts no timing).
package main

import (
	"context"
	"errors"
	"flag"
	"fmt"
	"os"
	"os/signal"
	"sort"
	"syscall"
)

// Env is what every scenario gets: the flags and where to write.
type Env struct {
	Quick bool
	// DatabaseURL is an admin URL of a Postgres server; scenarios create
	// their own databases on it. Empty means start a throwaway cluster.
	DatabaseURL string
	Out         *os.File
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
	dbURL := fs.String("database-url", os.Getenv("BENCH_DATABASE_URL"), "admin URL of a Postgres server to use (default: start a throwaway cluster)")
	fs.Usage = func() {
		fmt.Fprintln(fs.Output(), "usage: bench [--quick] [--database-url URL] list | all | run NAME...")
		fs.PrintDefaults()
	}
	if err := fs.Parse(os.Args[1:]); err != nil {
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
	env := Env{Quick: *quick, DatabaseURL: *dbURL, Out: os.Stdout}
	failed := 0
	for _, n := range names {
		fmt.Printf("\n== %s\n", n)
		if err := scenarios[n].run(ctx, env); err != nil {
			if errors.Is(err, context.Canceled) {
				return 1
			}
			fmt.Fprintf(os.Stderr, "bench %s: %v\n", n, err)
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
