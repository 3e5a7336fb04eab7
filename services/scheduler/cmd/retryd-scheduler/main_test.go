package main

import (
	"bytes"
	"context"
	"encoding/json"
	"io"
	"net/http"
	"strings"
	"testing"
	"time"

	"github.com/rs/zerolog"
	"github.com/stretchr/testify/require"

	"github.com/retryd/retryd/internal/freeaddr"
	"github.com/retryd/retryd/internal/natstest"
	"github.com/retryd/retryd/migrations/pgtest"
	"github.com/retryd/retryd/pkg/contract"
	"github.com/retryd/retryd/services/scheduler"
)

func TestMain(m *testing.M) { pgtest.Main(m) }

func freeAddr(t *testing.T) string {
	t.Helper()
	addr, err := freeaddr.Loopback()
	require.NoError(t, err)
	return addr
}

// adminToken is the bootstrap admin token the tests start the binary with.
const adminToken = "rtd_test-admin-token-0123456789abcdef0123456789"

func get(t *testing.T, url string) (int, string) {
	t.Helper()
	return getAs(t, url, adminToken)
}

func getAs(t *testing.T, url, token string) (int, string) {
	t.Helper()
	req, err := http.NewRequest(http.MethodGet, url, nil)
	require.NoError(t, err)
	if token != "" {
		req.Header.Set("Authorization", "Bearer "+token)
	}
	resp, err := http.DefaultClient.Do(req)
	if err != nil {
		return 0, ""
	}
	defer resp.Body.Close()
	b, _ := io.ReadAll(resp.Body)
	return resp.StatusCode, string(b)
}

// The binary serves the API, health and metrics from the environment,
// stops cleanly when its context ends (SIGTERM), and rebuilds on demand.
func TestServeAndRebuild(t *testing.T) {
	srv := natstest.RunServer(t)
	addr := freeAddr(t)
	t.Setenv("DATABASE_URL", pgtest.NewDatabaseURL(t))
	t.Setenv("NATS_URL", srv.ClientURL())
	t.Setenv("RETRYD_HTTP_ADDR", addr)
	t.Setenv("RETRYD_SCHEDULER_MAX_IDLE", "50ms")
	t.Setenv("RETRYD_SCHEDULER_ERROR_PATTERNS", `{"rate_limit": ["(?i)slow down"]}`)
	t.Setenv("RETRYD_ADMIN_TOKEN", adminToken)
	log := zerolog.New(io.Discard)

	ctx, cancel := context.WithCancel(context.Background())
	defer cancel()
	done := make(chan error, 1)
	go func() { done <- serveCmd(ctx, log) }()
	base := "http://" + addr
	require.Eventually(t, func() bool { code, _ := get(t, base+"/readyz"); return code == http.StatusOK }, 30*time.Second, 20*time.Millisecond)

	_, js := natstest.Connect(t, srv)
	msg, err := contract.NewLifecycleMsg("test", contract.Failed, contract.FailedData{Kind: "event", ID: "e1", Attempt: 1,
		Error: contract.ErrorInfo{Message: "please slow down"}, RetryAfter: contract.RetryAfterDuration(10 * time.Millisecond)}, time.Now())
	require.NoError(t, err)
	_, err = js.PublishMsg(ctx, msg)
	require.NoError(t, err)
	var body map[string]any
	require.Eventually(t, func() bool {
		code, raw := get(t, base+"/v1/retries/event/e1")
		if code != http.StatusOK {
			return false
		}
		require.NoError(t, json.Unmarshal([]byte(raw), &body))
		return body["retry"].(map[string]any)["state"] == "due"
	}, 30*time.Second, 20*time.Millisecond)
	require.Equal(t, "rate_limit", body["retry"].(map[string]any)["last_error_class"], "patterns from the environment")
	code, metrics := get(t, base+"/metrics")
	require.Equal(t, http.StatusOK, code)
	require.Contains(t, metrics, `retryd_scheduler_due_total{kind="event"} 1`)
	require.Contains(t, metrics, "go_goroutines")

	// The binary hosts the jobs projection, the jobs/analytics API and the
	// dashboard next to the scheduler's API.
	job, err := contract.NewJobMsg("test", contract.JobData{ID: "j1", JobType: "report", Attempt: 1}, time.Now())
	require.NoError(t, err)
	_, err = js.PublishMsg(ctx, job)
	require.NoError(t, err)
	require.Eventually(t, func() bool {
		code, raw := get(t, base+"/v1/jobs/j1")
		return code == http.StatusOK && strings.Contains(raw, `"in_progress"`)
	}, 30*time.Second, 20*time.Millisecond)
	code, raw := get(t, base+"/v1/analytics/retries")
	require.Equal(t, http.StatusOK, code, raw)
	code, raw = get(t, base+"/ui/")
	require.Equal(t, http.StatusOK, code)
	require.Contains(t, raw, "retryd")
	code, raw = get(t, base+"/ui/api/summary")
	require.Equal(t, http.StatusOK, code)
	require.Contains(t, raw, `"event"`)

	// Tokens are on by default: no token, no API; the token routes are
	// served here.
	code, _ = getAs(t, base+"/v1/retries/event/e1", "")
	require.Equal(t, http.StatusUnauthorized, code)
	code, _ = getAs(t, base+"/ui/api/summary", "")
	require.Equal(t, http.StatusUnauthorized, code)
	code, raw = get(t, base+"/v1/tokens")
	require.Equal(t, http.StatusOK, code)
	require.Contains(t, raw, `"name":"bootstrap"`)

	cancel()
	requireStopped(t, done)

	// The projection is not empty: rebuild refuses. On an empty database
	// it rebuilds.
	err = rebuildCmd(context.Background(), log, io.Discard)
	require.ErrorIs(t, err, scheduler.ErrNotEmpty)
	t.Setenv("DATABASE_URL", pgtest.NewDatabaseURL(t))
	var out bytes.Buffer
	require.NoError(t, rebuildCmd(context.Background(), log, &out))
	var stats scheduler.RebuildStats
	require.NoError(t, json.Unmarshal(out.Bytes(), &stats))
	require.Equal(t, int64(1), stats.Retries)
	require.Zero(t, stats.Malformed)
}

func TestSettingsErrorsNameVariables(t *testing.T) {
	t.Setenv("DATABASE_URL", "")
	t.Setenv("RETRYD_SCHEDULER_BATCH_SIZE", "many")
	t.Setenv("RETRYD_SCHEDULER_MAX_IDLE", "soon")
	t.Setenv("RETRYD_MIGRATE", "perhaps")
	t.Setenv("RETRYD_SCHEDULER_ERROR_PATTERNS", `{"rate_limit": ["("]}`)
	_, err := readSettings(zerolog.Nop())
	require.Error(t, err)
	for _, name := range []string{"DATABASE_URL", "RETRYD_SCHEDULER_BATCH_SIZE", "RETRYD_SCHEDULER_MAX_IDLE", "RETRYD_MIGRATE", "RETRYD_SCHEDULER_ERROR_PATTERNS"} {
		require.Contains(t, err.Error(), name)
	}
}

// requireStopped waits for serveCmd, cancelled, to return without error.
func requireStopped(t *testing.T, done <-chan error) {
	t.Helper()
	select {
	case err := <-done:
		require.NoError(t, err)
	case <-time.After(30 * time.Second):
		t.Fatal("serve did not stop")
	}
}
