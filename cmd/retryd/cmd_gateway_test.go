package main

import (
	"context"
	"encoding/json"
	"net/http"
	"net/http/httptest"
	"net/url"
	"strings"
	"testing"

	"github.com/prometheus/client_golang/prometheus"
	"github.com/rs/zerolog"
	"github.com/stretchr/testify/require"

	"github.com/retryd/retryd/internal/dashboard"
	"github.com/retryd/retryd/internal/serve"
	"github.com/retryd/retryd/pkg/contract"
)

func TestGateway(t *testing.T) {
	t.Parallel()
	b := setup(t, nil)
	up, err := url.Parse(b.api)
	require.NoError(t, err)
	down, err := url.Parse("http://127.0.0.1:1")
	require.NoError(t, err)
	health := &serve.Health{}
	health.SetReady(true)
	gw := httptest.NewServer(serve.Guard{}.Handler(gatewayHandler(upstreams{scheduler: up, ingress: up, triggers: up, jobs: down}, nil,
		func(ctx context.Context) (dashboard.Summary, error) { return b.stack.Summary(ctx) },
		prometheus.NewRegistry(), health, zerolog.Nop())))
	t.Cleanup(gw.Close)

	// The CLI works through the gateway as through retryd dev.
	id := contract.NewID()
	b.fail(t, id, "gw_type", 1, "network", "connection reset")
	b.waitRetry(t, "job", id, "scheduled")
	r := cli(t, "--api", gw.URL, "retries", "list", "--job-type", "gw_type")
	require.Equal(t, exitOK, r.code, r.stderr)
	require.Contains(t, r.stdout, id)
	r = cli(t, "--api", gw.URL, "sources", "set", "gw_source", "--rate-limit", "1", "--window", "1s")
	require.Equal(t, exitOK, r.code, r.stderr)
	r = cli(t, "--api", gw.URL, "policies", "get", "job")
	require.Equal(t, exitOK, r.code, r.stderr)

	// An unreachable service answers 502 with an error body.
	r = cli(t, "--api", gw.URL, "analytics")
	require.Equal(t, exitFailed, r.code)
	require.Contains(t, r.stderr, "HTTP 502 bad_gateway")

	for path, want := range map[string]string{"/ui/": "retryd", "/ui/api/summary": `"scheduled"`, "/healthz": "ok", "/readyz": "ready"} {
		code, body := get(t, gw.URL+path)
		require.Equal(t, http.StatusOK, code, path)
		require.Contains(t, body, want, path)
	}
	code, _ := get(t, gw.URL+"/v1/unknown")
	require.Equal(t, http.StatusNotFound, code)
	code, body := get(t, gw.URL+"/v1/")
	require.Equal(t, http.StatusOK, code)
	require.Contains(t, body, `"path":"/v1/analytics/retries"`, "the index lists the routes of services behind the gateway too")
}

func TestProbeAndDevCerts(t *testing.T) {
	t.Parallel()
	ok := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, _ *http.Request) {}))
	t.Cleanup(ok.Close)
	notReady := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, _ *http.Request) { w.WriteHeader(503) }))
	t.Cleanup(notReady.Close)
	require.Equal(t, exitOK, cli(t, "probe", ok.URL).code)
	require.Equal(t, exitFailed, cli(t, "probe", notReady.URL).code)
	require.Equal(t, exitFailed, cli(t, "probe", "http://127.0.0.1:1/readyz").code)
	require.Equal(t, exitUsage, cli(t, "probe").code)

	dir := t.TempDir()
	r := cli(t, "dev-certs", "--dir", dir, "--hosts", "nats,127.0.0.1")
	require.Equal(t, exitOK, r.code, r.stderr)
	require.Contains(t, r.stdout, "for nats, 127.0.0.1")
	r = cli(t, "dev-certs", "--dir", dir, "--keep")
	require.Equal(t, exitOK, r.code)
	require.Contains(t, r.stdout, "Kept the certificates")
	require.Equal(t, exitUsage, cli(t, "dev-certs").code)
}

// With --ingress-operator, the gateway sends intake to --ingress and the
// operator routes of ingress to --ingress-operator.
func TestGatewayIngressOperatorUpstream(t *testing.T) {
	t.Parallel()
	upstream := func(name string) *url.URL {
		srv := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
			serve.WriteJSON(w, http.StatusOK, map[string]string{"upstream": name, "path": r.URL.Path})
		}))
		t.Cleanup(srv.Close)
		u, err := url.Parse(srv.URL)
		require.NoError(t, err)
		return u
	}
	intake, operator, other := upstream("intake"), upstream("operator"), upstream("other")
	health := &serve.Health{}
	gw := httptest.NewServer(serve.Guard{}.Handler(gatewayHandler(upstreams{scheduler: other, ingress: intake, ingressOperator: operator, triggers: other, jobs: other}, nil,
		nil, prometheus.NewRegistry(), health, zerolog.Nop())))
	t.Cleanup(gw.Close)
	for path, want := range map[string]string{
		"/v1/events": "intake", "/v1/events:batch": "intake",
		"/v1/events/e1/cancel": "operator", "/v1/sources": "operator", "/v1/sources/shop/pause": "operator",
	} {
		resp, err := http.Post(gw.URL+path, "application/json", strings.NewReader(`{}`))
		require.NoError(t, err)
		var body map[string]string
		require.NoError(t, json.NewDecoder(resp.Body).Decode(&body))
		_ = resp.Body.Close()
		require.Equal(t, want, body["upstream"], path)
	}
}
