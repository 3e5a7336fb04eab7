package main

import (
	"context"
	"encoding/json"
	"net/http"
	"os"
	"strings"
	"testing"
	"time"

	"github.com/nats-io/nats.go"
	"github.com/rs/zerolog"
	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/retryd/retryd/cmd/retryd/internal/devstack"
	"github.com/retryd/retryd/internal/servicetest"
	"github.com/retryd/retryd/migrations/pgtest"
	"github.com/retryd/retryd/pkg/contract"
	"github.com/retryd/retryd/pkg/worker"
)

func TestMain(m *testing.M) { pgtest.Main(m) }

// wait bounds every poll of the tests.
const wait = 30 * time.Second

// bundle is a running retryd: the dev stack on a fresh database, an
// embedded NATS on a free port and HTTP on a free port.
type bundle struct {
	stack *devstack.Stack
	api   string
	ctx   context.Context
}

func testLogger(t *testing.T) zerolog.Logger {
	if os.Getenv("RETRYD_TEST_LOG") != "" {
		return zerolog.New(zerolog.NewTestWriter(t)).Level(zerolog.DebugLevel)
	}
	return zerolog.New(zerolog.NewTestWriter(t)).Level(zerolog.ErrorLevel)
}

// setup starts a stack; handlers are worker handlers by job type.
func setup(t *testing.T, handlers map[string]worker.Handler) *bundle {
	t.Helper()
	return setupStack(t, devstack.Config{Handlers: handlers})
}

// setupStack starts a stack of cfg with what every bundle has: a fresh
// database, an embedded NATS and HTTP on free ports, quick fetches.
func setupStack(t *testing.T, cfg devstack.Config) *bundle {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), 5*time.Minute)
	t.Cleanup(cancel)
	cfg.DataDir, cfg.HTTPAddr, cfg.NATSPort = t.TempDir(), "127.0.0.1:0", -1
	cfg.DatabaseURL, cfg.PoolConns = pgtest.NewDatabaseURL(t), 12
	cfg.Logger, cfg.FetchWait = testLogger(t), 200*time.Millisecond
	stack := startStack(ctx, t, cfg)
	return &bundle{stack: stack, api: stack.URL(), ctx: ctx}
}

// startStack builds and starts a stack of cfg; at cleanup it stops, and
// must stop cleanly.
func startStack(ctx context.Context, t *testing.T, cfg devstack.Config) *devstack.Stack {
	t.Helper()
	stack, err := devstack.New(cfg)
	require.NoError(t, err)
	require.NoError(t, stack.Start(ctx))
	t.Cleanup(func() {
		sctx, scancel := context.WithTimeout(context.Background(), 30*time.Second)
		defer scancel()
		require.NoError(t, stack.Stop(sctx))
	})
	return stack
}

// result is one CLI run.
type result struct {
	code   int
	stdout string
	stderr string
}

// cli runs the retryd command line in-process.
func cli(t *testing.T, args ...string) result {
	t.Helper()
	var out, errOut servicetest.Buffer
	code := run(context.Background(), args, &out, &errOut)
	return result{code: code, stdout: out.String(), stderr: errOut.String()}
}

// usageCase is a command line the CLI refuses as a usage error, and what
// the refusal says.
type usageCase struct {
	args []string
	want string
}

// requireUsage runs each command line against an address where nothing
// listens: each is refused before any request, as a usage error.
func requireUsage(t *testing.T, cases []usageCase) {
	t.Helper()
	for _, tc := range cases {
		r := cli(t, append([]string{"--api", "http://127.0.0.1:1"}, tc.args...)...)
		require.Equal(t, exitUsage, r.code, "retryd %v: %s %s", tc.args, r.stdout, r.stderr)
		require.Contains(t, r.stderr, tc.want, "retryd %v", tc.args)
	}
}

// cli runs a command against the bundle's API.
func (b *bundle) cli(t *testing.T, args ...string) result {
	t.Helper()
	return cli(t, append([]string{"--api", b.api}, args...)...)
}

// ok runs a command that must succeed and returns its stdout.
func (b *bundle) ok(t *testing.T, args ...string) string {
	t.Helper()
	r := b.cli(t, args...)
	require.Equal(t, exitOK, r.code, "retryd %v: stdout %q stderr %q", args, r.stdout, r.stderr)
	return r.stdout
}

// okJSON runs a command with --json and decodes its stdout.
func (b *bundle) okJSON(t *testing.T, v any, args ...string) {
	t.Helper()
	out := b.ok(t, append(args, "--json")...)
	require.NoError(t, json.Unmarshal([]byte(out), v), "output: %s", out)
}

// fail publishes the failure of a job's attempt, as a worker would.
func (b *bundle) fail(t *testing.T, id, jobType string, attempt int, class, msg string) {
	t.Helper()
	b.failed(t, contract.FailedData{
		Kind: contract.KindJob, ID: id, Attempt: attempt, JobType: jobType,
		Error: contract.ErrorInfo{Class: class, Message: msg},
	})
}

// failed publishes a failure, as an owner (a worker) would.
func (b *bundle) failed(t *testing.T, fd contract.FailedData) {
	t.Helper()
	m, err := contract.NewLifecycleMsg("retryd/test", contract.Failed, fd, time.Now())
	b.publish(t, m, err)
}

// publish publishes m, a lifecycle message built with err, on the
// stack's NATS.
func (b *bundle) publish(t *testing.T, m *nats.Msg, err error) {
	t.Helper()
	require.NoError(t, err)
	_, err = b.stack.JS.PublishMsg(b.ctx, m)
	require.NoError(t, err)
}

// held publishes a hold, as an owner (ingress, triggers) would.
func (b *bundle) held(t *testing.T, hd contract.HeldData) {
	t.Helper()
	m, err := contract.NewLifecycleMsg("retryd/test", contract.Held, hd, time.Now())
	b.publish(t, m, err)
}

// released publishes the release of every hold under a key.
func (b *bundle) released(t *testing.T, rd contract.ReleasedData) {
	t.Helper()
	m, err := contract.NewLifecycleMsg("retryd/test", contract.Released, rd, time.Now())
	b.publish(t, m, err)
}

// postEvent sends a producer event to ingress.
func (b *bundle) postEvent(t *testing.T, body string) {
	t.Helper()
	resp, err := http.Post(b.api+"/v1/events", "application/json", strings.NewReader(body))
	require.NoError(t, err)
	defer resp.Body.Close()
	require.Equal(t, http.StatusAccepted, resp.StatusCode)
}

// waitRetry polls the CLI until kind/id is in state.
func (b *bundle) waitRetry(t *testing.T, kind, id, state string) retryView {
	t.Helper()
	var v retryView
	var last result
	ok := assert.Eventually(t, func() bool {
		last = b.cli(t, "retries", "show", kind, id, "--json")
		if last.code != exitOK {
			return false
		}
		v = retryView{}
		return json.Unmarshal([]byte(last.stdout), &v) == nil && string(v.Retry.State) == state
	}, wait, 20*time.Millisecond, "%s/%s never reached %s", kind, id, state)
	if !ok {
		t.Fatalf("last answer: %s %s", last.stdout, last.stderr)
	}
	return v
}
