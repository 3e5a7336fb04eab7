package main

import (
	"bufio"
	"context"
	"fmt"
	"os"
	"runtime"
	"runtime/debug"
	"strings"
	"time"

	"github.com/nats-io/nats-server/v2/server"
)

// printHeader says when, where and with what the figures were taken.
func printHeader(ctx context.Context, env Env, names []string) {
	mode := "full"
	if env.Quick {
		mode = "quick"
	}
	fmt.Fprintf(env.Out, "retryd bench (%s) %s\n", mode, time.Now().UTC().Format(time.RFC3339))
	fmt.Fprintf(env.Out, "machine: %s, %d cores (GOMAXPROCS %d), load average %s\n", cpuModel(), runtime.NumCPU(), runtime.GOMAXPROCS(0), loadAvg())
	fmt.Fprintf(env.Out, "versions: %s, nats-server %s (embedded), nats.go %s, PostgreSQL %s, River %s, pgx %s\n",
		runtime.Version(), server.VERSION, depVersion("github.com/nats-io/nats.go"), serverVersion(ctx, env.pg),
		depVersion("github.com/riverqueue/river"), depVersion("github.com/jackc/pgx/v5"))
	where := "a cluster started by the bench (PostgreSQL defaults for durability; " + strings.Join(pgTuning, ", ") + ")"
	if env.pg.cluster == nil {
		where = "the server at --database-url"
	}
	fmt.Fprintf(env.Out, "postgres: %s\n", where)
	fmt.Fprintf(env.Out, "nats: embedded, file storage, %s\n", env.NATSSync)
	fmt.Fprintf(env.Out, "scenarios: %s\n", strings.Join(names, " "))
}

func depVersion(path string) string {
	bi, ok := debug.ReadBuildInfo()
	if !ok {
		return "unknown"
	}
	for _, d := range bi.Deps {
		if d.Path == path {
			if d.Replace != nil {
				return d.Replace.Version
			}
			return d.Version
		}
	}
	return "unknown"
}

func cpuModel() string {
	f, err := os.Open("/proc/cpuinfo")
	if err != nil {
		return runtime.GOARCH
	}
	defer f.Close()
	sc := bufio.NewScanner(f)
	for sc.Scan() {
		if k, v, ok := strings.Cut(sc.Text(), ":"); ok && strings.TrimSpace(k) == "model name" {
			return strings.TrimSpace(v)
		}
	}
	return runtime.GOARCH
}

func loadAvg() string {
	b, err := os.ReadFile("/proc/loadavg")
	if err != nil {
		return "unknown"
	}
	f := strings.Fields(string(b))
	if len(f) < 3 {
		return "unknown"
	}
	return strings.Join(f[:3], " ")
}
