package scheduler_test

import (
	"context"
	"encoding/json"
	"fmt"
	"net/http"
	"net/http/httptest"
	"strings"
	"testing"

	"github.com/stretchr/testify/require"

	"github.com/retryd/retryd/internal/audit"
	"github.com/retryd/retryd/internal/serve"
	"github.com/retryd/retryd/migrations/pgtest"
	"github.com/retryd/retryd/pkg/contract"
	"github.com/retryd/retryd/services/scheduler"
	"github.com/retryd/retryd/stores/retrystore"
)

// tokens is an Authenticator over fixed tokens.
type tokens map[string]serve.Principal

func (ts tokens) Authenticate(_ context.Context, tok string) (serve.Principal, error) {
	if p, ok := ts[tok]; ok {
		return p, nil
	}
	return serve.Principal{}, fmt.Errorf("token: %w", serve.ErrBadCredential)
}

// auditRows are the audit log's rows, oldest first, as
// "principal role action target".
func auditRows(t *testing.T, b *bundle) []string {
	t.Helper()
	return pgtest.Strings(t, b.pool, `SELECT principal || ' ' || role || ' ' || action || ' ' || target FROM audit_log ORDER BY id`)
}

// Operator actions and policy changes through the API record the token's
// name, whatever the body says; refused and failed ones record nothing.
func TestAuditOfActions(t *testing.T) {
	t.Parallel()
	b := setup(t)
	s := b.start(t)
	guard := serve.Guard{Verifier: tokens{
		"op": {Name: "oncall", Role: serve.RoleOperator}, "view": {Name: "looker", Role: serve.RoleViewer},
		"adm": {Name: "boss", Role: serve.RoleAdmin},
	}}
	srv := httptest.NewServer(guard.Handler(s.Handler()))
	t.Cleanup(srv.Close)
	do := func(token, method, path, body string) int {
		t.Helper()
		req, err := http.NewRequestWithContext(b.ctx, method, srv.URL+path, strings.NewReader(body))
		require.NoError(t, err)
		req.Header.Set("Authorization", "Bearer "+token)
		if body != "" {
			req.Header.Set("Content-Type", "application/json")
		}
		resp, err := http.DefaultClient.Do(req)
		require.NoError(t, err)
		require.NoError(t, resp.Body.Close())
		return resp.StatusCode
	}
	b.policy(t, "au", "", 3, hourMS, hourMS)
	for _, id := range []string{"a", "b"} {
		b.publish(t, contract.Failed, failed("au", id, 1, "timeout"))
		b.waitRow(t, "au", id, inState(retrystore.StateScheduled, 2))
	}
	b.publish(t, contract.Failed, failed(contract.KindJob, "j1", 1, "timeout"))
	b.waitRow(t, contract.KindJob, "j1", inState(retrystore.StateScheduled, 2))
	require.Empty(t, auditRows(t, b), "decisions and stored policies are not operator actions")

	require.Equal(t, http.StatusOK, do("op", "POST", "/v1/retries/au/a/cancel", `{"reason":"duplicate","by":"mallory"}`))
	// Refused (403, 401) and failed (409, 404, 400) actions record nothing.
	require.Equal(t, http.StatusForbidden, do("view", "POST", "/v1/retries/au/b/cancel", `{"reason":"x"}`))
	require.Equal(t, http.StatusUnauthorized, do("nope", "POST", "/v1/retries/au/b/cancel", `{"reason":"x"}`))
	require.Equal(t, http.StatusConflict, do("op", "POST", "/v1/retries/au/a/cancel", ""))
	require.Equal(t, http.StatusNotFound, do("op", "POST", "/v1/retries/au/nope/retry", ""))
	require.Equal(t, http.StatusBadRequest, do("op", "POST", "/v1/retries/au/b/retry", `{"oops":1}`))
	require.Equal(t, http.StatusOK, do("op", "POST", "/v1/retries/au/b/retry", `{"reason":"fixed","by":"mallory","reset_attempts":true}`))

	put := `{"name":"au","max_retries":5,"base_delay_ms":5000,"max_delay_ms":10000,"version":%d,"updated_by":"mallory"}`
	require.Equal(t, http.StatusForbidden, do("op", "PUT", "/v1/policies/au/_", fmt.Sprintf(put, 1)))
	require.Equal(t, http.StatusConflict, do("adm", "PUT", "/v1/policies/au/_", fmt.Sprintf(put, 7)))
	require.Equal(t, http.StatusOK, do("adm", "PUT", "/v1/policies/au/_", fmt.Sprintf(put, 1)))

	// The jobs API cancels jobs through the scheduler's action, named as a
	// job action; its bulk runner, with no principal, records nothing.
	ctx := serve.WithPrincipal(b.ctx, serve.Principal{Name: "oncall", Role: serve.RoleOperator})
	require.NoError(t, scheduler.RetryController{S: s.Scheduler}.Cancel(audit.Named(ctx, audit.JobCancel), contract.KindJob, "j1", "mallory", "gone"))
	require.NoError(t, scheduler.RetryController{S: s.Scheduler}.RetryNow(b.ctx, contract.KindJob, "j1", "bulk", "runner", false, ""))

	require.Equal(t, []string{
		"oncall operator retry.cancel retry/au/a",
		"oncall operator retry.retry retry/au/b",
		"boss admin policy.put policy/au/_",
		"oncall operator job.cancel job/j1",
	}, auditRows(t, b))
	page, err := audit.List(b.ctx, b.pool, audit.Filter{Action: audit.RetryRetry})
	require.NoError(t, err)
	require.Len(t, page.Entries, 1)
	var d map[string]any
	require.NoError(t, json.Unmarshal(page.Entries[0].Detail, &d))
	require.Equal(t, map[string]any{"reason": "fixed", "attempt": 3.0, "reset_attempts": true}, d)
	require.NotContains(t, strings.Join(auditRows(t, b), " "), "mallory")
}
