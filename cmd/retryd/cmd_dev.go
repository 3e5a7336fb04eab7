package main

import (
	"context"
	"crypto/tls"
	"errors"
	"fmt"
	"io"
	"os"
	"os/signal"
	"path/filepath"
	"strings"
	"syscall"
	"time"

	"github.com/rs/zerolog"
	"github.com/spf13/cobra"

	"github.com/retryd/retryd/cmd/retryd/internal/demo"
	"github.com/retryd/retryd/cmd/retryd/internal/devstack"
	"github.com/retryd/retryd/internal/auth"
	"github.com/retryd/retryd/internal/dashboard"
	"github.com/retryd/retryd/internal/envvar"
	"github.com/retryd/retryd/internal/serve"
	"github.com/retryd/retryd/migrations/pgcluster"
)

// devStopTimeout bounds the graceful stop of `retryd dev`.
const devStopTimeout = 30 * time.Second

type devFlags struct {
	dataDir     string
	httpAddr    string
	natsHost    string
	natsPort    int
	natsSync    string
	databaseURL string
	pgBinDir    string
	demo        bool
	traffic     float64
	logLevel    string
	logFile     string
	statusEvery time.Duration
}

func newDevCmd(g *globals) *cobra.Command {
	f := devFlags{}
	cmd := &cobra.Command{
		Use:   "dev",
		Short: "Run all of retryd in one process: NATS, Postgres, every service, the dashboard",
		Long: `dev runs retryd on your machine in one process: an embedded NATS server with
JetStream on disk, a local Postgres (started from the installed binaries
unless DATABASE_URL is set), the schema and streams, the scheduler, ingress,
triggers, the jobs projection and API and a worker, behind one HTTP server
with the dashboard at /ui/. Everything is kept in --data-dir across runs.

--demo feeds it realistic traffic: a rate-limited source, a source paused
now and then, a throttled trigger with a max concurrency, and a flaky
worker, with policies of seconds, so retries, exhaustion and analytics
appear within a minute.

Ctrl-C (SIGINT) or SIGTERM stops it gracefully.`,
		Example: `  go run ./cmd/retryd dev --demo
  retryd dev --http :9090 --nats-port 4333
  DATABASE_URL=postgres://me@localhost/retryd retryd dev`,
		Args: args(0),
		RunE: func(cmd *cobra.Command, _ []string) error { return runDev(cmd, g, f) },
	}
	fl := cmd.Flags()
	fl.StringVar(&f.dataDir, "data-dir", devstack.DefaultDataDir, "where NATS and Postgres keep their data")
	fl.StringVar(&f.httpAddr, "http", devstack.DefaultHTTPAddr, "HTTP listen address: APIs, /ui/, /healthz, /readyz, /metrics")
	fl.StringVar(&f.natsHost, "nats-host", devstack.DefaultNATSHost, "NATS listen host")
	fl.IntVar(&f.natsPort, "nats-port", devstack.DefaultNATSPort, "NATS listen port (-1: any free port)")
	fl.StringVar(&f.natsSync, "nats-sync", "always", `JetStream fsync: "always" (every write) or an interval such as 1s or 2m`)
	fl.StringVar(&f.databaseURL, "database-url", os.Getenv("DATABASE_URL"), "Postgres URL (default $DATABASE_URL; empty: a local cluster in --data-dir)")
	fl.StringVar(&f.pgBinDir, "postgres-bin-dir", "", "directory of initdb and pg_ctl for the local Postgres (default: PATH, then /usr/lib/postgresql/*/bin)")
	fl.BoolVar(&f.demo, "demo", false, "feed demo traffic and set demo policies (delays of seconds)")
	fl.Float64Var(&f.traffic, "demo-traffic", 1, "scale the demo's traffic (2 = twice as much)")
	fl.StringVar(&f.logLevel, "log-level", "info", "debug, info, warn or error")
	fl.StringVar(&f.logFile, "log-file", "", `log file (default <data-dir>/retryd.log; "-" for stderr)`)
	fl.DurationVar(&f.statusEvery, "status-interval", time.Second, "how often the status line refreshes")
	return cmd
}

func runDev(cmd *cobra.Command, g *globals, f devFlags) error {
	cfg := devstack.Config{DataDir: f.dataDir, HTTPAddr: f.httpAddr, NATSHost: f.natsHost, NATSPort: f.natsPort,
		DatabaseURL: f.databaseURL, PostgresBinDir: f.pgBinDir}
	authCfg, err := auth.FromEnv(nil)
	if err != nil {
		return usageErr(err)
	}
	if os.Getenv(auth.EnvMode) == "" {
		// Unset: off while only this machine can connect, tokens (with an
		// admin token printed below) as soon as --http reaches further.
		authCfg.Mode = auth.ModeOff
		if !serve.IsLoopback(f.httpAddr) {
			authCfg.Mode = auth.ModeTokens
		}
	}
	cfg.Auth = authCfg
	cfg.TLS = serve.TLSFromEnv()
	e := &envvar.Reader{}
	cfg.IntakeRate, cfg.IntakeBurst = e.Float("RETRYD_INTAKE_RATE"), e.Int("RETRYD_INTAKE_BURST")
	if err := e.Err(); err != nil {
		return usageErr(err)
	}
	switch f.natsSync {
	case "always":
		cfg.NATSSyncAlways = true
	default:
		d, err := time.ParseDuration(f.natsSync)
		if err != nil || d <= 0 {
			return usageErrorf(cmd, `--nats-sync %q is not "always" or a duration such as 1s`, f.natsSync)
		}
		cfg.NATSSyncInterval = d
	}
	if f.natsPort == 0 || f.natsPort < -1 || f.natsPort > 65535 {
		return usageErrorf(cmd, "--nats-port must be a port or -1, got %d", f.natsPort)
	}
	if f.traffic <= 0 || f.traffic > 100 {
		return usageErrorf(cmd, "--demo-traffic must be above 0 and at most 100, got %v", f.traffic)
	}
	if f.statusEvery < 100*time.Millisecond {
		return usageErrorf(cmd, "--status-interval must be at least 100ms")
	}
	level, err := zerolog.ParseLevel(f.logLevel)
	if err != nil || level == zerolog.NoLevel {
		return usageErrorf(cmd, "--log-level %q is not debug, info, warn or error", f.logLevel)
	}
	if err := os.MkdirAll(f.dataDir, 0o755); err != nil {
		return fmt.Errorf("create data directory: %w", err)
	}
	logOut, logName, closeLog, err := openLog(f, g.stderr)
	if err != nil {
		return err
	}
	defer closeLog()
	log := zerolog.New(logOut).Level(level).With().Timestamp().Logger()
	cfg.Logger, cfg.PostgresLog = log, logWriter{log}
	if f.demo {
		cfg.Handlers = demo.Handlers()
	}

	ctx, stop := signal.NotifyContext(cmd.Context(), syscall.SIGTERM, os.Interrupt)
	defer stop()
	out := g.stdout
	abs, _ := filepath.Abs(f.dataDir)
	fmt.Fprintf(out, "Starting retryd (data in %s)…\n", abs)
	stack, err := devstack.New(cfg)
	if err != nil {
		return usageErr(err)
	}
	if err := stack.Start(ctx); err != nil {
		if errors.Is(err, pgcluster.ErrNoPostgres) {
			return fmt.Errorf("start retryd dev: %w", err)
		}
		return fmt.Errorf("start retryd dev: %w\n(details in %s)", err, logName)
	}
	var dm *demo.Demo
	if f.demo {
		// The demo calls the API over TLS too: it trusts the served
		// certificate itself (self-signed, for 127.0.0.1) and --ca-file.
		var clientTLS *tls.Config
		if cfg.TLS.Enabled() {
			clientTLS, err = serve.ClientTLS(cfg.TLS.CertFile, g.caFile)
		}
		if err == nil {
			dm, err = demo.New(demo.Config{API: stack.URL(), Token: stack.AdminToken(), JS: stack.JS, Logger: log, Traffic: f.traffic, TLS: clientTLS})
		}
		if err == nil {
			err = dm.Start(ctx)
		}
		if err != nil {
			_ = stack.Stop(context.Background())
			return fmt.Errorf("start demo: %w", err)
		}
	}
	printBanner(out, stack, f, abs, logName, authCfg.AdminTokenFrom)

	statusLoop(ctx, out, stack, f.statusEvery)
	// A second Ctrl-C during the graceful stop kills the process at once.
	stop()

	fmt.Fprintln(out, "Stopping (draining consumers)…")
	stopCtx, cancel := context.WithTimeout(context.Background(), devStopTimeout)
	defer cancel()
	var errs []error
	if dm != nil {
		errs = append(errs, dm.Stop(stopCtx))
	}
	errs = append(errs, stack.Stop(stopCtx))
	if err := errors.Join(errs...); err != nil {
		return fmt.Errorf("stop retryd dev: %w", err)
	}
	fmt.Fprintln(out, "Stopped.")
	return nil
}

// openLog opens the dev runner's log: a file in the data directory, so
// the terminal keeps the banner and the status line.
func openLog(f devFlags, stderr io.Writer) (io.Writer, string, func(), error) {
	if f.logFile == "-" {
		return stderr, "stderr", func() {}, nil
	}
	name := f.logFile
	if name == "" {
		name = filepath.Join(f.dataDir, "retryd.log")
	}
	file, err := os.OpenFile(name, os.O_CREATE|os.O_WRONLY|os.O_APPEND, 0o644)
	if err != nil {
		return nil, "", nil, fmt.Errorf("open log file: %w", err)
	}
	return file, name, func() { _ = file.Close() }, nil
}

// logWriter sends initdb and pg_ctl output to the log.
type logWriter struct{ log zerolog.Logger }

func (w logWriter) Write(p []byte) (int, error) {
	for _, line := range strings.Split(strings.TrimSpace(string(p)), "\n") {
		if line != "" {
			w.log.Info().Str("component", "postgres").Msg(line)
		}
	}
	return len(p), nil
}

// printBanner says where everything listens. An admin token the stack
// made is shown (once: each start makes a new one); one the user set is
// named by tokenFrom, the variable it came from, never printed.
func printBanner(out io.Writer, s *devstack.Stack, f devFlags, dataDir, logName, tokenFrom string) {
	url := s.URL()
	pg := "the server of --database-url (DATABASE_URL)"
	if local, dir := s.LocalPostgres(); local {
		pg = s.DatabaseURL() + "  (local cluster in " + dir + ")"
	}
	fmt.Fprintf(out, `
retryd is running.

  Dashboard  %s/ui/
  API        %s/v1/  (retryd --api %s retries list)
  Health     %s/healthz  %s/readyz  %s/metrics
  NATS       %s  (nats --server %s stream ls)
  Postgres   %s
  Data       %s
  Logs       %s
`, url, url, url, url, url, url, s.NATSURL(), s.NATSURL(), pg, dataDir, logName)
	switch tok := s.AdminToken(); {
	case tok != "" && tokenFrom != "":
		fmt.Fprintf(out, `  Auth       tokens (RETRYD_AUTH=tokens). Admin token: the one in %s
             export RETRYD_TOKEN=<it> for the CLI; the dashboard asks for it.
`, tokenFrom)
	case tok != "":
		fmt.Fprintf(out, `  Auth       tokens (RETRYD_AUTH=tokens). Admin token, shown once:
               %s
             export RETRYD_TOKEN=<it> for the CLI; the dashboard asks for it.
`, tok)
	default:
		fmt.Fprintf(out, `  Auth       OFF: every request acts as admin. Allowed only because %s is loopback;
             RETRYD_AUTH=tokens turns tokens on (see docs/security.md).
`, f.httpAddr)
	}
	if !serve.IsLoopback(f.natsHost) {
		// Only with tokens on: off is refused for a NATS beyond loopback.
		fmt.Fprintf(out, `  WARNING    NATS listens on %s with no users: tokens guard the HTTP server only, and anyone
             who reaches NATS may read, publish and purge the streams.
`, f.natsHost)
	}
	if f.demo {
		fmt.Fprintf(out, `  Demo       source %s (rate limit 3/s, bursts), source %s (paused 15s every minute, then resumed: the resume releases its held events),
             trigger %s (throttle 2/s, max concurrency 3, runs heartbeat a 5s lease), flaky jobs %s, %s, %s;
             demo policies retry after seconds, not hours
`, demo.SourceShop, demo.SourcePartner, demo.TriggerID, demo.JobSendEmail, demo.JobSyncCRM, demo.JobChargeCard)
	}
	fmt.Fprintln(out, "\nPress Ctrl-C to stop.")
}

// statusLoop prints the retry counts until ctx ends: one line rewritten in
// place on a terminal, a plain line on each change otherwise.
func statusLoop(ctx context.Context, out io.Writer, s *devstack.Stack, every time.Duration) {
	tty := isTerminal(out)
	t := time.NewTicker(every)
	defer t.Stop()
	last := ""
	for {
		line := statusLine(ctx, s)
		switch now := time.Now().Format("15:04:05"); {
		case tty:
			fmt.Fprintf(out, "\r\033[K%s %s", now, line)
		case line != last:
			fmt.Fprintln(out, now, line)
		}
		last = line
		select {
		case <-ctx.Done():
			if tty {
				fmt.Fprintln(out)
			}
			return
		case <-t.C:
		}
	}
}

func statusLine(ctx context.Context, s *devstack.Stack) string {
	qctx, cancel := context.WithTimeout(ctx, 2*time.Second)
	defer cancel()
	sum, err := s.Summary(qctx)
	if err != nil {
		if ctx.Err() != nil {
			return "stopping…"
		}
		return "status unavailable: " + err.Error()
	}
	return formatStatus(sum)
}

// formatStatus is the status line: retries by state, then per kind.
func formatStatus(sum dashboard.Summary) string {
	byState := map[string]int64{}
	kinds := map[string]int64{}
	var kindOrder []string
	for _, c := range sum.Counts {
		byState[c.State] += c.Count
		if c.State == "scheduled" || c.State == "due" {
			if _, ok := kinds[c.Kind]; !ok {
				kindOrder = append(kindOrder, c.Kind)
			}
			kinds[c.Kind] += c.Count
		}
	}
	line := fmt.Sprintf("retries: %d pending · %d due · %d succeeded · %d exhausted · %d cancelled",
		byState["scheduled"], byState["due"], byState["succeeded"], byState["exhausted"], byState["cancelled"])
	if len(kindOrder) > 0 {
		var parts []string
		for _, k := range kindOrder {
			parts = append(parts, fmt.Sprintf("%s %d", k, kinds[k]))
		}
		line += "  (waiting: " + strings.Join(parts, ", ") + ")"
	}
	return line
}

func isTerminal(w io.Writer) bool {
	f, ok := w.(*os.File)
	if !ok {
		return false
	}
	fi, err := f.Stat()
	return err == nil && fi.Mode()&os.ModeCharDevice != 0
}
