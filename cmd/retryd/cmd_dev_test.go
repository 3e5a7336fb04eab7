package main

import (
	"context"
	"encoding/json"
	"io"
	"net/http"
	"os"
	"path/filepath"
	"regexp"
	"slices"
	"strings"
	"testing"
	"time"

	"github.com/stretchr/testify/require"

	"github.com/retryd/retryd/internal/auth"
	"github.com/retryd/retryd/internal/dashboard"
	"github.com/retryd/retryd/internal/serve"
	"github.com/retryd/retryd/internal/servicetest"
	"github.com/retryd/retryd/migrations/pgtest"
	"github.com/retryd/retryd/services/ingress"
	"github.com/retryd/retryd/services/jobs"
	"github.com/retryd/retryd/services/scheduler"
	"github.com/retryd/retryd/services/triggers"
)

// devRun is `retryd dev` running in-process.
type devRun struct {
	out, errOut *servicetest.Buffer
	cancel      context.CancelFunc
	done        chan int
	url         string
	logFile     string
}

// startDev runs `retryd dev` with args on a fresh database and free ports,
// and waits for its banner.
func startDev(t *testing.T, args ...string) *devRun {
	t.Helper()
	dir := t.TempDir()
	ctx, cancel := context.WithCancel(context.Background())
	d := &devRun{out: &servicetest.Buffer{}, errOut: &servicetest.Buffer{}, cancel: cancel, done: make(chan int, 1),
		logFile: filepath.Join(dir, "dev.log")}
	base := []string{"dev", "--data-dir", dir, "--http", "127.0.0.1:0", "--nats-port", "-1", "--nats-sync", "1s",
		"--database-url", pgtest.NewDatabaseURL(t), "--log-file", d.logFile, "--status-interval", "200ms"}
	go func() { d.done <- run(ctx, append(base, args...), d.out, d.errOut) }()
	t.Cleanup(func() {
		cancel()
		select {
		case <-d.done:
		case <-time.After(time.Minute):
			t.Error("retryd dev did not stop")
		}
	})
	dashboardLine := regexp.MustCompile(`Dashboard\s+(http://\S+)/ui/`)
	require.Eventually(t, func() bool {
		select {
		case code := <-d.done:
			d.done <- code
			t.Fatalf("retryd dev exited with %d: %s %s", code, d.out, d.errOut)
		default:
		}
		m := dashboardLine.FindStringSubmatch(d.out.String())
		if m != nil {
			d.url = m[1]
		}
		return m != nil
	}, wait, 20*time.Millisecond, "no banner: %s", d.out)
	return d
}

// stop sends the equivalent of Ctrl-C and returns the exit code.
func (d *devRun) stop(t *testing.T) int {
	t.Helper()
	d.cancel()
	select {
	case code := <-d.done:
		d.done <- code
		return code
	case <-time.After(time.Minute):
		t.Fatal("retryd dev did not stop within a minute")
	}
	return -1
}

func get(t *testing.T, url string) (int, string) {
	t.Helper()
	resp, err := http.Get(url)
	require.NoError(t, err)
	defer resp.Body.Close()
	b, err := io.ReadAll(resp.Body)
	require.NoError(t, err)
	return resp.StatusCode, string(b)
}

// requireIndex checks that GET /v1/, the address retryd dev prints,
// lists every service's routes, and that each GET route without a path
// parameter answers.
func requireIndex(t *testing.T, base string) {
	t.Helper()
	code, body := get(t, base+"/v1/")
	require.Equal(t, http.StatusOK, code, body)
	var idx serve.Index
	require.NoError(t, json.Unmarshal([]byte(body), &idx))
	want := slices.Concat(scheduler.Routes(), ingress.Routes(), triggers.Routes(), jobs.Routes(), auth.Routes())
	require.Len(t, idx.Routes, len(want)+1, "every route and the index itself")
	require.Subset(t, idx.Routes, want)
	require.Contains(t, body, `{"method":"GET","path":"/v1/","description":`)
	for _, r := range idx.Routes {
		require.NotEmpty(t, r.Description, r.Path)
		if r.Method == http.MethodGet && !strings.Contains(r.Path, "{") {
			code, body := get(t, base+r.Path)
			require.Equal(t, http.StatusOK, code, "%s: %s", r.Path, body)
		}
	}
}

func TestDevCommand(t *testing.T) {
	t.Parallel()
	d := startDev(t)
	out := d.out.String()
	require.Contains(t, out, "retryd is running.")
	require.Regexp(t, `API\s+http://127\.0\.0\.1:\d+/v1/`, out)
	require.Regexp(t, `NATS\s+nats://127\.0\.0\.1:\d+`, out)
	require.Contains(t, out, "Press Ctrl-C to stop.")
	require.NotContains(t, out, "Demo")
	require.Regexp(t, `Auth\s+OFF: every request acts as admin`, out, "dev on loopback runs without tokens, and says so")
	// Retention ran before the services started (then hourly).
	log, err := os.ReadFile(d.logFile)
	require.NoError(t, err)
	require.Regexp(t, `"component":"maintenance".*"table":"retry_history"`, string(log))

	for path, want := range map[string]string{
		"/healthz": `"ok"`, "/readyz": `"ready"`, "/ui/": "<title>retryd</title>",
		"/metrics": "retryd_scheduler_", "/v1/policies": "job-default", "/v1/sources": `"sources"`,
		"/v1/triggers": "[", "/v1/analytics/retries": "job_types", "/v1/jobs": "jobs",
	} {
		code, body := get(t, d.url+path)
		require.Equal(t, http.StatusOK, code, "%s: %s", path, body)
		require.Contains(t, body, want, path)
	}
	code, body := get(t, d.url+"/v1/nothing")
	require.Equal(t, http.StatusNotFound, code)
	require.Contains(t, body, `"code":"not_found"`)
	requireIndex(t, d.url)
	code, _ = get(t, d.url+"/")
	require.Equal(t, http.StatusOK, code, "/ redirects to the dashboard")

	// The CLI talks to it, and the status line follows the counts.
	r := cli(t, "--api", d.url, "policies", "get", "job")
	require.Equal(t, exitOK, r.code, r.stderr)
	require.Eventually(t, func() bool {
		return strings.Contains(d.out.String(), "retries: 0 pending · 0 due · 0 succeeded · 0 exhausted · 0 cancelled")
	}, wait, 20*time.Millisecond)

	require.Equal(t, exitOK, d.stop(t), d.errOut.String())
	require.Contains(t, d.out.String(), "Stopping (draining consumers)…\nStopped.\n")
}

func TestDevWithoutPostgres(t *testing.T) {
	t.Parallel()
	dir := t.TempDir()
	r := cli(t, "dev", "--data-dir", dir, "--http", "127.0.0.1:0", "--nats-port", "-1", "--database-url", "",
		"--postgres-bin-dir", filepath.Join(dir, "no-postgres-here"), "--log-file", filepath.Join(dir, "dev.log"))
	require.Equal(t, exitFailed, r.code)
	require.Contains(t, r.stderr, "no DATABASE_URL, and no local Postgres to start")
	require.Contains(t, r.stderr, "apt-get install postgresql-15")
	require.Contains(t, r.stderr, "DATABASE_URL=postgres://user@host/db go run ./cmd/retryd dev")
	require.Contains(t, r.stdout, "Starting retryd")
}

func TestDevUsage(t *testing.T) {
	t.Parallel()
	for _, args := range [][]string{
		{"dev", "--nats-sync", "sometimes"},
		{"dev", "--nats-port", "0"},
		{"dev", "--demo-traffic", "0"},
		{"dev", "--log-level", "loud"},
		{"dev", "extra"},
	} {
		r := cli(t, args...)
		require.Equal(t, exitUsage, r.code, "%v: %s", args, r.stderr)
	}
}

// TestDevDemo is the new user's first minute: `retryd dev --demo` shows
// retries of every kind, exhaustion and analytics.
func TestDevDemo(t *testing.T) {
	if testing.Short() {
		t.Skip("runs the demo traffic for up to a minute")
	}
	t.Parallel()
	d := startDev(t, "--demo", "--demo-traffic", "3")
	require.Contains(t, d.out.String(), "Demo       source shop")

	seen := map[string]bool{}
	require.Eventually(t, func() bool {
		code, body := get(t, d.url+"/ui/api/summary")
		if code != http.StatusOK {
			return false
		}
		var sum dashboard.Summary
		require.NoError(t, json.Unmarshal([]byte(body), &sum))
		for _, c := range sum.Counts {
			seen[c.Kind] = true
			seen["state:"+c.State] = true
		}
		return seen["event"] && seen["event-trigger"] && seen["job"] && seen["state:exhausted"] && seen["state:succeeded"]
	}, 90*time.Second, 250*time.Millisecond, "demo retries seen: %v", seen)

	var a analyticsView
	require.Eventually(t, func() bool {
		r := cli(t, "--api", d.url, "analytics", "--json")
		a = analyticsView{}
		if r.code != exitOK || json.Unmarshal([]byte(r.stdout), &a) != nil || len(a.JobTypes) < 3 {
			return false
		}
		var retries int64
		for _, ta := range a.JobTypes {
			retries += ta.TotalRetries
		}
		return retries > 0
	}, wait, 250*time.Millisecond, "analytics: %+v", a)

	r := cli(t, "--api", d.url, "sources", "list")
	require.Equal(t, exitOK, r.code)
	require.Regexp(t, `shop\s+3 per 1s`, r.stdout)
	require.Equal(t, exitOK, d.stop(t), d.errOut.String())
}
