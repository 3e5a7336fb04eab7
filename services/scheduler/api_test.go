package scheduler_test

import (
	"encoding/json"
	"net/http"
	"net/http/httptest"
	"strings"
	"testing"
	"time"

	"github.com/stretchr/testify/require"

	"github.com/retryd/retryd/internal/serve"
	"github.com/retryd/retryd/internal/servicetest"
	"github.com/retryd/retryd/pkg/contract"
	"github.com/retryd/retryd/pkg/policy"
	"github.com/retryd/retryd/stores/retrystore"
)

type apiClient struct {
	t   *testing.T
	url string
}

// startAPI starts an instance and serves its API.
func (b *bundle) startAPI(t *testing.T) (instance, apiClient) {
	t.Helper()
	s := b.start(t)
	srv := httptest.NewServer(serve.Guard{}.Handler(s.Handler()))
	t.Cleanup(srv.Close)
	return s, apiClient{t: t, url: srv.URL}
}

func (c apiClient) do(method, path, body string) (int, map[string]any) {
	c.t.Helper()
	resp, raw := servicetest.Request(c.t, c.t.Context(), method, c.url+path, body)
	var out map[string]any
	require.NoError(c.t, json.Unmarshal(raw, &out), "body %s", raw)
	return resp.StatusCode, out
}

func errField(body map[string]any) string {
	e, _ := body["error"].(map[string]any)
	f, _ := e["field"].(string)
	return f
}

func TestRetriesAPI(t *testing.T) {
	t.Parallel()
	b := setup(t)
	s, api := b.startAPI(t)
	b.policy(t, "api", "", 3, hourMS, hourMS)

	for _, id := range []string{"a", "b", "c"} {
		fd := failed("api", id, 1, "timeout")
		fd.Source = "crm"
		b.publish(t, contract.Failed, fd)
	}
	b.publish(t, contract.Failed, failed("api", "d", 1, "validation"))
	b.waitRow(t, "api", "d", inState(retrystore.StateExhausted, 1))
	for _, id := range []string{"a", "b", "c"} {
		b.waitRow(t, "api", id, inState(retrystore.StateScheduled, 2))
	}

	status, body := api.do("GET", "/v1/retries?kind=api&state=scheduled&source=crm&limit=2", "")
	require.Equal(t, http.StatusOK, status)
	require.Len(t, body["retries"], 2)
	cursor := body["next_cursor"].(string)
	status, body = api.do("GET", "/v1/retries?kind=api&state=scheduled&source=crm&limit=2&cursor="+cursor, "")
	require.Equal(t, http.StatusOK, status)
	require.Len(t, body["retries"], 1)
	require.Nil(t, body["next_cursor"])

	for _, bad := range []struct{ query, field string }{
		{"state=waiting", "state"}, {"limit=0", "limit"}, {"kind=Bad", "kind"},
		{"cursor=zz", "cursor"}, {"color=red", "color"}, {"limit=5000", "limit"},
	} {
		status, body = api.do("GET", "/v1/retries?"+bad.query, "")
		require.Equal(t, http.StatusBadRequest, status, bad.query)
		require.Equal(t, bad.field, errField(body), bad.query)
	}

	// "Why did it retry?": the row with its history.
	status, body = api.do("GET", "/v1/retries/api/a", "")
	require.Equal(t, http.StatusOK, status)
	require.Equal(t, "scheduled", body["retry"].(map[string]any)["state"])
	hist := body["history"].([]any)
	require.Len(t, hist, 2)
	decision := hist[1].(map[string]any)
	require.Equal(t, "backoff", decision["decided_by"])
	require.Equal(t, "api-policy", decision["policy_name"])

	status, _ = api.do("GET", "/v1/retries/api/zzz", "")
	require.Equal(t, http.StatusNotFound, status)
	status, body = api.do("GET", "/v1/retries/api/bad%20id", "")
	require.Equal(t, http.StatusBadRequest, status)
	require.Equal(t, "id", errField(body))

	status, body = api.do("POST", "/v1/retries/api/a/cancel", `{"reason":"duplicate order","by":"ops"}`)
	require.Equal(t, http.StatusOK, status)
	require.Equal(t, "cancelled", body["retry"].(map[string]any)["state"])
	status, _ = api.do("POST", "/v1/retries/api/a/cancel", "")
	require.Equal(t, http.StatusConflict, status)
	status, body = api.do("POST", "/v1/retries/api/b/cancel", `{"reason":"x","oops":1}`)
	require.Equal(t, http.StatusBadRequest, status)
	require.Equal(t, "oops", errField(body))
	status, _ = api.do("POST", "/v1/retries/api/b/cancel", `{"reason":"`+strings.Repeat("x", 70<<10)+`"}`)
	require.Equal(t, http.StatusRequestEntityTooLarge, status)

	status, body = api.do("POST", "/v1/retries/api/d/retry", `{"reason":"fixed validation","reset_attempts":true}`)
	require.Equal(t, http.StatusOK, status)
	retry := body["retry"].(map[string]any)
	require.Equal(t, "scheduled", retry["state"])
	require.EqualValues(t, 2, retry["attempt"])
	b.waitRow(t, "api", "d", inState(retrystore.StateDue, 2))
	status, _ = api.do("POST", "/v1/retries/api/nope/retry", "")
	require.Equal(t, http.StatusNotFound, status)

	// b and c wait, d is due, a is cancelled; the outbox is empty.
	require.Eventually(t, func() bool {
		return metric(t, s.reg, "retryd_scheduler_pending", "kind", "api", "state", "scheduled") == 2 &&
			metric(t, s.reg, "retryd_scheduler_pending", "kind", "api", "state", "due") == 1
	}, waitFor, 20*time.Millisecond)
	require.Zero(t, metric(t, s.reg, "retryd_scheduler_outbox_pending"))
}

func TestPoliciesAPI(t *testing.T) {
	t.Parallel()
	b := setup(t)
	_, api := b.startAPI(t)

	status, body := api.do("GET", "/v1/policies", "")
	require.Equal(t, http.StatusOK, status)
	require.Len(t, body["policies"], len(policy.Defaults()), "the seeded policies")
	status, body = api.do("GET", "/v1/policies/job/email_campaign", "")
	require.Equal(t, http.StatusOK, status)
	require.Equal(t, "email-campaign", body["name"])
	for _, def := range []string{"_", "default"} {
		status, body = api.do("GET", "/v1/policies/event/"+def, "")
		require.Equal(t, http.StatusOK, status)
		require.Equal(t, "event-ingress", body["name"])
	}
	status, body = api.do("GET", "/v1/policies/*/_", "")
	require.Equal(t, http.StatusOK, status)
	require.Equal(t, "default", body["name"])
	status, _ = api.do("GET", "/v1/policies/job/nothing", "")
	require.Equal(t, http.StatusNotFound, status)

	// A new policy starts from the seeded fallback's values, unnamed; a
	// PUT of the template under a name stores it as it is.
	status, body = api.do("GET", "/v1/policies/template?kind=job&job_type=fresh", "")
	require.Equal(t, http.StatusOK, status, body)
	want, err := json.Marshal(policy.Template("job", "fresh"))
	require.NoError(t, err)
	got, err := json.Marshal(body)
	require.NoError(t, err)
	require.JSONEq(t, string(want), string(got))
	require.Equal(t, "", body["name"])
	status, _ = api.do("GET", "/v1/policies/template?kind=not%20a%20kind", "")
	require.Equal(t, http.StatusBadRequest, status)

	// A policy update is used by the decisions after it, and versioned.
	b.policy(t, "pu", "", 3, 60_000, 60_000)
	b.failTo(t, "pu", "before", 1, "timeout", retrystore.StateScheduled)

	status, body = api.do("PUT", "/v1/policies/pu/_", `{"name":"pu-fast","max_retries":5,"base_delay_ms":5000,"max_delay_ms":10000,"jitter":"none","version":1,"updated_by":"carol"}`)
	require.Equal(t, http.StatusOK, status, body)
	require.EqualValues(t, 2, body["version"])
	b.failTo(t, "pu", "after", 1, "timeout", retrystore.StateScheduled)
	h := b.history(t, "pu", "after")
	require.Equal(t, "pu-fast", h[1].PolicyName)
	require.Equal(t, 2, h[1].PolicyVersion)
	require.Equal(t, int64(5000), *h[1].DelayMS)
	h = b.history(t, "pu", "before")
	require.Equal(t, 1, h[1].PolicyVersion)

	status, body = api.do("GET", "/v1/policies/pu/default/versions", "")
	require.Equal(t, http.StatusOK, status)
	versions := body["versions"].([]any)
	require.Len(t, versions, 2)
	require.Equal(t, "local", versions[0].(map[string]any)["changed_by"], "the principal, not the body's updated_by")

	// A stale version conflicts; a new job type policy is created.
	status, _ = api.do("PUT", "/v1/policies/pu/_", `{"name":"x","max_retries":1,"base_delay_ms":1,"max_delay_ms":1,"version":1}`)
	require.Equal(t, http.StatusConflict, status)
	status, body = api.do("PUT", "/v1/policies/pu/reports", `{"name":"pu-reports","max_retries":1,"base_delay_ms":1000,"max_delay_ms":2000,"non_retryable_classes":["validation_error"]}`)
	require.Equal(t, http.StatusCreated, status, body)
	require.Equal(t, []any{"validation"}, body["non_retryable_classes"])
	require.Equal(t, "additive", body["jitter"])
	require.EqualValues(t, 30*24*3600*1000, body["max_hold_ms"], "default max_hold")
	require.EqualValues(t, 24*3600*1000, body["max_retry_after_ms"], "default max_retry_after")
	status, body = api.do("PUT", "/v1/policies/pu/holds", `{"name":"pu-holds","max_retries":1,"base_delay_ms":1000,"max_delay_ms":2000,"max_hold_ms":3600000,"max_retry_after_ms":60000}`)
	require.Equal(t, http.StatusCreated, status, body)
	require.EqualValues(t, 3600000, body["max_hold_ms"])
	require.EqualValues(t, 60000, body["max_retry_after_ms"])

	// A policy as GET returns it can be put back: kind and job_type match
	// the path, and the timestamps are the store's.
	body["updated_by"] = "dave"
	raw, err := json.Marshal(body)
	require.NoError(t, err)
	status, again := api.do("PUT", "/v1/policies/pu/holds", string(raw))
	require.Equal(t, http.StatusOK, status, again)
	require.EqualValues(t, 2, again["version"])
	require.Equal(t, "local", again["updated_by"], "the principal's name; the body's updated_by is ignored")
	for _, same := range []string{"name", "max_retries", "base_delay_ms", "max_delay_ms", "max_hold_ms", "class_backoff", "created_at"} {
		require.Equal(t, body[same], again[same], same)
	}

	for _, bad := range []struct{ path, body, field string }{
		{"/v1/policies/pu/_", `{"name":"x","base_delay_ms":1,"max_delay_ms":1}`, "max_retries"},
		{"/v1/policies/pu/_", `{"name":"x","max_retries":1,"base_delay_ms":10,"max_delay_ms":1}`, "max_delay_ms"},
		{"/v1/policies/pu/_", `{"name":"x","max_retries":1,"base_delay_ms":1,"max_delay_ms":1,"jitter":"lots"}`, "jitter"},
		{"/v1/policies/pu/_", `{"name":"x","max_retries":1,"base_delay_ms":1,"max_delay_ms":1,"retryable_classes":["weird"]}`, "retryable_classes"},
		{"/v1/policies/pu/_", `{"name":"","max_retries":1,"base_delay_ms":1,"max_delay_ms":1}`, "name"},
		{"/v1/policies/pu/_", `{"name":"x","max_retries":1,"base_delay_ms":1,"max_delay_ms":1,"multiplier":0.5}`, "multiplier"},
		{"/v1/policies/PU/_", `{"name":"x","max_retries":1,"base_delay_ms":1,"max_delay_ms":1}`, "kind"},
		{"/v1/policies/*/x", `{"name":"x","max_retries":1,"base_delay_ms":1,"max_delay_ms":1}`, "job_type"},
		{"/v1/policies/pu/_", `[]`, "body"},
		{"/v1/policies/pu/_", `{"name":"x","max_retries":1,"base_delay_ms":1,"max_delay_ms":1,"max_hold_ms":-1}`, "max_hold_ms"},
		{"/v1/policies/pu/_", `{"name":"x","max_retries":1,"base_delay_ms":1,"max_delay_ms":1,"max_hold_ms":31622400001}`, "max_hold_ms"},
		{"/v1/policies/pu/_", `{"name":"x","max_retries":1,"base_delay_ms":1,"max_delay_ms":1,"max_retry_after_ms":-5}`, "max_retry_after_ms"},
		{"/v1/policies/pu/_", `{"name":"x","max_retries":null,"base_delay_ms":1,"max_delay_ms":1}`, "max_retries"},
		{"/v1/policies/pu/_", `{"name":"x","max_retries":1,"base_delay_ms":1,"max_delay_ms":1,"max_retry":3}`, "max_retry"},
		{"/v1/policies/pu/_", `{"name":"x","max_retries":"1","base_delay_ms":1,"max_delay_ms":1}`, "max_retries"},
		{"/v1/policies/pu/_", `{"name":"x\u0000","max_retries":1,"base_delay_ms":1,"max_delay_ms":1}`, "name"},
		{"/v1/policies/pu/_", `{"kind":"other","name":"x","max_retries":1,"base_delay_ms":1,"max_delay_ms":1}`, "kind"},
		{"/v1/policies/pu/_", `{"job_type":"other","name":"x","max_retries":1,"base_delay_ms":1,"max_delay_ms":1}`, "job_type"},
	} {
		status, body = api.do("PUT", bad.path, bad.body)
		require.Equal(t, http.StatusBadRequest, status, bad.body)
		require.Equal(t, bad.field, errField(body), bad.body)
	}
}
