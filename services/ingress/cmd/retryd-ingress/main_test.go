package main

import (
	"context"
	"crypto/tls"
	"io"
	"net/http"
	"strings"
	"testing"
	"time"

	"github.com/rs/zerolog"
	"github.com/stretchr/testify/require"

	"github.com/retryd/retryd/internal/natstest"
	"github.com/retryd/retryd/internal/serve/servetest"
	"github.com/retryd/retryd/migrations/pgtest"
)

func TestMain(m *testing.M) { pgtest.Main(m) }

// adminToken is the bootstrap admin token the tests start the binary with.
const adminToken = "rtd_test-admin-token-0123456789abcdef0123456789"

// startRun runs the binary (run) in the background until the test ends
// and waits until it reports its listeners ready: the intake's address
// and the operator API's. stop ends it as SIGTERM does and requires a
// graceful stop, with no error (exit 0).
func startRun(t *testing.T) (intake, operator string, stop func()) {
	t.Helper()
	ctx, cancel := context.WithCancel(context.Background())
	t.Cleanup(cancel)
	type addrPair struct{ intake, operator string }
	addrs := make(chan addrPair, 1)
	done := make(chan error, 1)
	go func() {
		done <- run(ctx, zerolog.Nop(), func(intake, operator string) { addrs <- addrPair{intake, operator} })
	}()
	select {
	case a := <-addrs:
		intake, operator = a.intake, a.operator
	case err := <-done:
		t.Fatalf("run ended before ready: %v", err)
	case <-time.After(time.Minute):
		t.Fatal("not ready within a minute")
	}
	return intake, operator, func() {
		t.Helper()
		cancel()
		select {
		case err := <-done:
			require.NoError(t, err, "a graceful stop exits 0")
		case <-time.After(time.Minute):
			t.Fatal("no stop within a minute")
		}
	}
}

// The binary's life: configured from the environment, ready, serving, and
// on cancellation (the signal) stopping cleanly with no error (exit 0).
// Not parallel: it sets environment variables.
func TestRunServesAndStopsGracefully(t *testing.T) {
	srv := natstest.RunServer(t)
	t.Setenv("DATABASE_URL", pgtest.NewDatabaseURL(t))
	t.Setenv("NATS_URL", srv.ClientURL())
	t.Setenv("RETRYD_HTTP_ADDR", "127.0.0.1:0")
	t.Setenv("RETRYD_INGRESS_ACK_WAIT", "2s")
	t.Setenv("RETRYD_ADMIN_TOKEN", adminToken)

	addr, _, stop := startRun(t)
	base := "http://" + addr

	do := func(method, path, token, body string) *http.Response {
		req, err := http.NewRequest(method, base+path, strings.NewReader(body))
		require.NoError(t, err)
		req.Header.Set("Content-Type", "application/json")
		if token != "" {
			req.Header.Set("Authorization", "Bearer "+token)
		}
		resp, err := http.DefaultClient.Do(req)
		require.NoError(t, err)
		return resp
	}
	get := func(path string) (int, string) {
		resp := do(http.MethodGet, path, adminToken, "")
		defer resp.Body.Close()
		b, err := io.ReadAll(resp.Body)
		require.NoError(t, err)
		return resp.StatusCode, string(b)
	}
	status, _ := get("/healthz")
	require.Equal(t, http.StatusOK, status)
	status, _ = get("/readyz")
	require.Equal(t, http.StatusOK, status)

	event := `{"id":"bin-1","source":"billing","type":"invoice.paid"}`
	resp := do(http.MethodPost, "/v1/events", "", event)
	resp.Body.Close()
	require.Equal(t, http.StatusUnauthorized, resp.StatusCode, "tokens are on by default")
	resp = do(http.MethodPost, "/v1/events", adminToken, event)
	resp.Body.Close()
	require.Equal(t, http.StatusAccepted, resp.StatusCode)
	require.Eventually(t, func() bool {
		status, body := get("/v1/events/bin-1")
		return status == http.StatusOK && strings.Contains(body, `"status":"admitted"`)
	}, 20*time.Second, 20*time.Millisecond)
	_, metrics := get("/metrics")
	require.Contains(t, metrics, `retryd_ingress_intake_total{result="accepted",source="billing"} 1`)
	require.Contains(t, metrics, "go_goroutines")

	stop()
}

func TestRunRejectsBadEnvironment(t *testing.T) {
	t.Setenv("DATABASE_URL", "")
	t.Setenv("RETRYD_INGRESS_ACK_WAIT", "soon")
	t.Setenv("RETRYD_INGRESS_MAX_BODY_BYTES", "-1")
	t.Setenv("RETRYD_HTTP_ADDR", ":8081")
	t.Setenv("RETRYD_OPERATOR_ADDR", "127.0.0.1:0")
	t.Setenv("RETRYD_AUTH", "off")
	t.Setenv("RETRYD_HTTP_TLS_CERT", "cert.pem")
	t.Setenv("RETRYD_INTAKE_RATE", "fast")
	err := run(context.Background(), zerolog.Nop(), nil)
	require.ErrorContains(t, err, `RETRYD_AUTH=off is only allowed when every listener is loopback, but ":8081" is not`)
	require.ErrorContains(t, err, "RETRYD_HTTP_TLS_CERT is set but RETRYD_HTTP_TLS_KEY is not")
	require.ErrorContains(t, err, `RETRYD_INTAKE_RATE must be a non-negative number, got "fast"`)
	require.ErrorContains(t, err, "DATABASE_URL is required")
	require.ErrorContains(t, err, `RETRYD_INGRESS_ACK_WAIT must be a duration such as 30s, got "soon"`)
	require.ErrorContains(t, err, "RETRYD_INGRESS_MAX_BODY_BYTES must be a non-negative integer")
}

// With RETRYD_OPERATOR_ADDR set, intake and the operator API are served on
// separate listeners, each 404 for the other's routes, and both over TLS
// when it is configured. Not parallel: it sets environment variables.
func TestRunSeparateOperatorListener(t *testing.T) {
	srv := natstest.RunServer(t)
	cert := servetest.SelfSigned(t)
	t.Setenv("DATABASE_URL", pgtest.NewDatabaseURL(t))
	t.Setenv("NATS_URL", srv.ClientURL())
	t.Setenv("RETRYD_HTTP_ADDR", "127.0.0.1:0")
	t.Setenv("RETRYD_OPERATOR_ADDR", "127.0.0.1:0")
	t.Setenv("RETRYD_HTTP_TLS_CERT", cert.CertFile)
	t.Setenv("RETRYD_HTTP_TLS_KEY", cert.KeyFile)
	t.Setenv("RETRYD_ADMIN_TOKEN", adminToken)

	intake, operator, stop := startRun(t)
	require.NotEqual(t, intake, operator)
	client := &http.Client{Timeout: 10 * time.Second, Transport: &http.Transport{TLSClientConfig: &tls.Config{RootCAs: cert.Pool}}}
	status := func(addr, method, path, body string) int {
		req, err := http.NewRequest(method, "https://"+addr+path, strings.NewReader(body))
		require.NoError(t, err)
		req.Header.Set("Content-Type", "application/json")
		req.Header.Set("Authorization", "Bearer "+adminToken)
		resp, err := client.Do(req)
		require.NoError(t, err)
		_ = resp.Body.Close()
		return resp.StatusCode
	}
	event := `{"id":"split-1","source":"billing","type":"invoice.paid"}`
	batch := `{"events":[{"id":"split-2","source":"billing","type":"invoice.paid"}]}`
	for _, addr := range []string{intake, operator} {
		require.Equal(t, http.StatusOK, status(addr, http.MethodGet, "/healthz", ""), addr)
		require.Equal(t, http.StatusOK, status(addr, http.MethodGet, "/readyz", ""), addr)
	}
	// Intake on the intake listener only.
	require.Equal(t, http.StatusAccepted, status(intake, http.MethodPost, "/v1/events", event))
	require.Equal(t, http.StatusAccepted, status(intake, http.MethodPost, "/v1/events:batch", batch))
	require.Equal(t, http.StatusNotFound, status(operator, http.MethodPost, "/v1/events", event))
	require.Equal(t, http.StatusNotFound, status(operator, http.MethodPost, "/v1/events:batch", batch))
	// The operator API on the operator listener only.
	require.Equal(t, http.StatusOK, status(operator, http.MethodGet, "/v1/sources", ""))
	require.Eventually(t, func() bool {
		return status(operator, http.MethodGet, "/v1/events/split-1", "") == http.StatusOK
	}, 20*time.Second, 20*time.Millisecond)
	for _, r := range []struct{ method, path string }{
		{http.MethodGet, "/v1/sources"},
		{http.MethodGet, "/v1/sources/billing"},
		{http.MethodPut, "/v1/sources/billing"},
		{http.MethodPost, "/v1/sources/billing/pause"},
		{http.MethodPost, "/v1/sources/billing/resume"},
		{http.MethodGet, "/v1/events/split-1"},
		{http.MethodPost, "/v1/events/split-1/cancel"},
	} {
		require.Equal(t, http.StatusNotFound, status(intake, r.method, r.path, "{}"), "%s %s on the intake listener", r.method, r.path)
	}

	stop()
}
