package ingress_test

import (
	"context"
	"encoding/json"
	"fmt"
	"net/http"
	"net/http/httptest"
	"strconv"
	"strings"
	"testing"

	"github.com/stretchr/testify/require"

	"github.com/retryd/retryd/internal/serve"
	"github.com/retryd/retryd/services/ingress"
)

// producers authenticates each token as a producer of the same name.
type producers struct{}

func (producers) Authenticate(_ context.Context, tok string) (serve.Principal, error) {
	return serve.Principal{Name: tok, Role: serve.RoleProducer}, nil
}

func TestIntakeRateLimitPerCaller(t *testing.T) {
	t.Parallel()
	const burst = 2
	b := setup(t, func(c *ingress.Config) {
		c.IntakeRate = 0.001 // one request per ~17 minutes once the burst is spent
		c.IntakeBurst = burst
	})
	srv := httptest.NewServer(serve.Guard{Verifier: producers{}}.Handler(b.svc.Handler()))
	t.Cleanup(srv.Close)
	post := func(token, path, body string) *http.Response {
		req, err := http.NewRequestWithContext(b.ctx, http.MethodPost, srv.URL+path, strings.NewReader(body))
		require.NoError(t, err)
		req.Header.Set("Content-Type", "application/json")
		req.Header.Set("Authorization", "Bearer "+token)
		resp, err := http.DefaultClient.Do(req)
		require.NoError(t, err)
		t.Cleanup(func() { _ = resp.Body.Close() })
		return resp
	}
	event := func(id string) string { return fmt.Sprintf(`{"id":%q,"source":"rl","type":"t"}`, id) }

	// The burst: one event, one batch (a batch is one request).
	require.Equal(t, http.StatusAccepted, post("shop", "/v1/events", event("rl-1")).StatusCode)
	require.Equal(t, http.StatusAccepted, post("shop", "/v1/events:batch", `{"events":[`+event("rl-2")+`]}`).StatusCode)
	// burst+1: refused, with when to come back.
	resp := post("shop", "/v1/events", event("rl-3"))
	require.Equal(t, http.StatusTooManyRequests, resp.StatusCode)
	secs, err := strconv.Atoi(resp.Header.Get("Retry-After"))
	require.NoError(t, err)
	require.GreaterOrEqual(t, secs, 1)
	var body serve.ErrorBody
	require.NoError(t, json.NewDecoder(resp.Body).Decode(&body))
	require.Equal(t, ingress.CodeRateLimited, body.Error.Code)
	require.Equal(t, http.StatusTooManyRequests, post("shop", "/v1/events:batch", `{"events":[`+event("rl-4")+`]}`).StatusCode)

	// Another caller has its own bucket.
	require.Equal(t, http.StatusAccepted, post("crm", "/v1/events", event("rl-5")).StatusCode)

	require.Equal(t, 2.0, b.counter(t, "retryd_ingress_intake_rate_limited_total", nil))
}
