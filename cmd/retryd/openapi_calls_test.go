package main

import (
	"net/http"
	"testing"
	"time"

	"github.com/stretchr/testify/require"

	"github.com/retryd/retryd/pkg/contract"
)

// Real requests to every route of a running stack, with tokens on: each
// request and each answer must fit docs/openapi.yaml, and every operation
// of the spec must be exercised. The requests the server refuses as
// invalid are refused by the spec too (refused).
func TestOpenAPIResponses(t *testing.T) {
	t.Parallel()
	b := setupTokens(t)
	c := newSpecChecker(t, b.api)
	c.tokens["admin"] = b.stack.AdminToken()
	const (
		get, post, put, del              = http.MethodGet, http.MethodPost, http.MethodPut, http.MethodDelete
		ok, created, accepted, noContent = http.StatusOK, http.StatusCreated, http.StatusAccepted, http.StatusNoContent
	)
	keepToken := func(role string) func([]byte) {
		return func(body []byte) { c.tokens[role] = jsonString(t, body, "token") }
	}
	var revokedID string

	// Tokens, the index and the sign-in.
	c.run(
		apiCall{method: post, path: "/v1/tokens", as: "admin", body: `{"name":"openapi-viewer","role":"viewer"}`, want: created, keep: keepToken("viewer")},
		apiCall{method: post, path: "/v1/tokens", as: "admin", body: `{"name":"openapi-producer","role":"producer"}`, want: created, keep: keepToken("producer")},
		apiCall{method: post, path: "/v1/tokens", as: "admin", body: `{"name":"openapi-revoked","role":"operator","expires_at":"2999-01-01T00:00:00Z"}`, want: created,
			keep: func(body []byte) { revokedID = jsonString(t, body, "id") }},
		apiCall{method: post, path: "/v1/tokens", as: "admin", body: `{"name":"openapi-viewer","role":"viewer"}`, want: http.StatusConflict},
		apiCall{method: post, path: "/v1/tokens", as: "admin", body: `{"name":"x"}`, contentType: "text/plain", want: http.StatusUnsupportedMediaType, refused: true},
		apiCall{method: post, path: "/v1/tokens", as: "admin", body: `{"name":"x","role":"root"}`, want: http.StatusBadRequest, refused: true},
		apiCall{method: get, path: "/v1/tokens", as: "admin", want: ok},
		apiCall{method: get, path: "/v1/tokens", as: "viewer", want: http.StatusForbidden},
		apiCall{method: get, path: "/v1/", as: "viewer", want: ok},
		apiCall{method: get, path: "/v1/", want: http.StatusUnauthorized, refused: true},
		apiCall{method: get, path: "/v1/whoami", as: "producer", want: ok},
		apiCall{method: post, path: "/login", body: `{"token":"` + c.tokens["admin"] + `"}`, want: ok},
		apiCall{method: post, path: "/login", body: `{"token":"rtd_not_a_token"}`, want: http.StatusUnauthorized},
		apiCall{method: post, path: "/logout", want: noContent},
		apiCall{method: get, path: "/healthz", want: ok},
		apiCall{method: get, path: "/readyz", want: ok},
		apiCall{method: get, path: "/metrics", want: ok},
	)
	c.run(
		apiCall{method: del, path: "/v1/tokens/" + revokedID, as: "admin", want: ok},
		apiCall{method: del, path: "/v1/tokens/tok-missing", as: "admin", want: http.StatusNotFound},
	)

	// Policies.
	c.run(
		apiCall{method: get, path: "/v1/policies", as: "viewer", want: ok},
		apiCall{method: get, path: "/v1/policies/template?kind=job&job_type=openapi_job", as: "viewer", want: ok},
		apiCall{method: get, path: "/v1/policies/job/_", as: "viewer", want: ok},
		apiCall{method: get, path: "/v1/policies/job/openapi_job", as: "viewer", want: http.StatusNotFound},
		apiCall{method: put, path: "/v1/policies/job/openapi_job", as: "admin", want: created,
			body: `{"name":"openapi","max_retries":3,"base_delay_ms":3600000,"max_delay_ms":7200000,"jitter":"none","class_backoff":{"rate_limit":{"base_delay_ms":60000}}}`},
		apiCall{method: put, path: "/v1/policies/job/openapi_job", as: "admin", want: ok,
			body: `{"name":"openapi","max_retries":4,"base_delay_ms":3600000,"max_delay_ms":7200000,"jitter":"none"}`},
		apiCall{method: put, path: "/v1/policies/job/openapi_job", as: "admin", want: http.StatusConflict,
			body: `{"name":"openapi","version":1,"max_retries":4,"base_delay_ms":3600000,"max_delay_ms":7200000}`},
		apiCall{method: put, path: "/v1/policies/job/openapi_job", as: "admin", want: http.StatusBadRequest, refused: true,
			body: `{"name":"openapi","max_retries":4,"base_delay_ms":1000,"max_delay_ms":2000,"colour":"red"}`},
		apiCall{method: put, path: "/v1/policies/job/openapi_job", as: "viewer", want: http.StatusForbidden,
			body: `{"name":"openapi","max_retries":4,"base_delay_ms":1000,"max_delay_ms":2000}`},
		apiCall{method: get, path: "/v1/policies/job/openapi_job/versions", as: "viewer", want: ok},
	)

	// Sources and events: a gate, a pause that defers an event, then
	// events admitted while a trigger listens.
	c.run(
		apiCall{method: put, path: "/v1/sources/shop", as: "admin", body: `{"rate_limit":1000,"rate_window":"1m","allowed_types":["order.created"]}`, want: ok},
		apiCall{method: put, path: "/v1/sources/shop", as: "admin", body: `{"rate_limit":1000}`, want: http.StatusBadRequest},
		apiCall{method: put, path: "/v1/sources/quiet", as: "admin", body: `{}`, want: ok},
		apiCall{method: get, path: "/v1/sources", as: "viewer", want: ok},
		apiCall{method: get, path: "/v1/sources/shop", as: "viewer", want: ok},
		apiCall{method: get, path: "/v1/sources/nowhere", as: "viewer", want: http.StatusNotFound},
		apiCall{method: post, path: "/v1/sources/shop/pause", as: "admin", body: `{"reason":"openapi test"}`, want: ok},
		apiCall{method: post, path: "/v1/triggers", as: "admin", want: created,
			body: `{"id":"trg-openapi","name":"fulfil orders","source":"shop","event_type":"order.created","workflow":"fulfil","throttle":{"limit":100,"window":"1m"}}`},
		apiCall{method: post, path: "/v1/triggers", as: "admin", want: http.StatusConflict,
			body: `{"id":"trg-openapi","name":"again","source":"shop","event_type":"order.created","workflow":"fulfil"}`},
		apiCall{method: post, path: "/v1/events", as: "producer", body: `{"id":"evt-deferred","source":"shop","type":"order.created","data":{"n":1}}`, want: accepted},
		apiCall{method: post, path: "/v1/events", as: "producer", body: `{"source":"shop","type":"order.refunded"}`, want: http.StatusBadRequest},
		apiCall{method: post, path: "/v1/events", as: "producer", body: `{"source":"https://crm.example.com/contacts","type":"contact.created","colour":"red","partitionkey":"p1"}`, want: accepted},
		apiCall{method: post, path: "/v1/events", as: "producer", body: `{"source":"shop","type":"order.created","colour_code":"red"}`, want: http.StatusBadRequest},
		apiCall{method: post, path: "/v1/events", as: "producer", body: `{"source":"shop","type":"order.created"}`, contentType: "text/plain", want: http.StatusUnsupportedMediaType, refused: true},
		apiCall{method: post, path: "/v1/events", as: "viewer", body: `{"source":"shop","type":"order.created"}`, want: http.StatusForbidden},
	)
	c.waitFor("/v1/events/evt-deferred", "viewer", status200(`"status":"deferred"`))
	c.run(
		apiCall{method: get, path: "/v1/events/evt-deferred", as: "viewer", want: ok},
		apiCall{method: post, path: "/v1/events/evt-deferred/cancel", as: "admin", body: `{"reason":"openapi test"}`, want: ok},
		apiCall{method: post, path: "/v1/events/evt-missing/cancel", as: "admin", want: http.StatusNotFound},
		apiCall{method: post, path: "/v1/sources/shop/resume", as: "admin", want: ok},
		apiCall{method: post, path: "/v1/sources/nowhere/resume", as: "admin", want: http.StatusNotFound},
		apiCall{method: post, path: "/v1/events", as: "producer", body: `{"id":"evt-admitted","source":"shop","type":"order.created","data":{"n":2}}`, want: accepted},
		apiCall{method: post, path: "/v1/events:batch", as: "producer", want: accepted,
			body: `{"events":[{"source":"shop","type":"order.created","data":{"n":3}},{"id":"evt-admitted","source":"shop","type":"order.created","data":{"n":2}}]}`},
		apiCall{method: post, path: "/v1/events:batch", as: "producer", body: `{"events":[]}`, want: http.StatusBadRequest, refused: true},
	)
	c.waitFor("/v1/events/evt-admitted", "viewer", status200(`"status":"admitted"`))
	c.run(
		apiCall{method: post, path: "/v1/events/evt-admitted/cancel", as: "admin", want: http.StatusConflict},
		apiCall{method: get, path: "/v1/events/evt-missing", as: "viewer", want: http.StatusNotFound},
	)

	// Triggers, their deliveries and runs.
	var deliveryID string
	c.waitFor("/v1/triggers/trg-openapi/deliveries", "viewer", status200(`"event_id":"evt-admitted"`))
	b.insertRun(t, "run-openapi", "fulfil", "retrying", time.Now().UTC(), "attempt = 2, retry_count = 1, last_error_class = 'timeout'")
	b.insertRunStep(t, "run-openapi", "charge", 1, "failed", 2, "scheduled", "timeout", "upstream timed out", "worker-1", `{"ok":false}`)
	c.run(
		apiCall{method: get, path: "/v1/triggers", as: "viewer", want: ok},
		apiCall{method: get, path: "/v1/triggers?source=shop&enabled=true&limit=10", as: "viewer", want: ok},
		apiCall{method: get, path: "/v1/triggers?limit=0", as: "viewer", want: http.StatusBadRequest, refused: true},
		apiCall{method: get, path: "/v1/triggers/trg-openapi", as: "viewer", want: ok},
		apiCall{method: put, path: "/v1/triggers/trg-openapi", as: "admin", want: ok,
			body: `{"name":"fulfil orders","source":"shop","event_type":"order.created","predicate":"event.type == \"order.created\"","workflow":"fulfil","run_timeout":"30m"}`},
		apiCall{method: put, path: "/v1/triggers/trg-openapi", as: "admin", want: http.StatusBadRequest,
			body: `{"name":"broken","source":"shop","event_type":"order.created","predicate":"event.type +","workflow":"fulfil"}`},
		apiCall{method: post, path: "/v1/triggers/trg-openapi/disable", as: "admin", want: ok},
		apiCall{method: post, path: "/v1/triggers/trg-openapi/enable", as: "admin", want: ok},
		apiCall{method: get, path: "/v1/triggers/trg-openapi/versions", as: "viewer", want: ok},
		apiCall{method: get, path: "/v1/triggers/trg-openapi/deliveries?limit=1", as: "viewer", want: ok,
			keep: func(body []byte) {
				var page struct {
					Deliveries []struct {
						ID string `json:"id"`
					} `json:"deliveries"`
				}
				requireJSON(t, body, &page)
				require.NotEmpty(t, page.Deliveries)
				deliveryID = page.Deliveries[0].ID
			}},
		apiCall{method: get, path: "/v1/triggers/trg-missing/deliveries", as: "viewer", want: http.StatusNotFound},
		apiCall{method: get, path: "/v1/runs", as: "viewer", want: ok},
		apiCall{method: get, path: "/v1/runs?status=permanently_failed&status=retrying&workflow=fulfil", as: "viewer", want: ok},
		apiCall{method: get, path: "/v1/runs?colour=red", as: "viewer", want: http.StatusBadRequest},
		apiCall{method: get, path: "/v1/runs/run-openapi", as: "viewer", want: ok},
		apiCall{method: get, path: "/v1/runs/run-missing", as: "viewer", want: http.StatusNotFound},
	)
	c.run(
		apiCall{method: get, path: "/v1/deliveries/" + deliveryID, as: "viewer", want: ok},
		apiCall{method: get, path: "/v1/deliveries/dlv-missing", as: "viewer", want: http.StatusNotFound},
		apiCall{method: del, path: "/v1/triggers/trg-openapi", as: "admin", want: noContent},
		apiCall{method: get, path: "/v1/triggers/trg-openapi", as: "viewer", want: http.StatusNotFound},
	)

	// Jobs and retries: a job that failed and retries under the slow
	// policy above, and one with no retry left for a bulk retry.
	job, dead := contract.NewID(), contract.NewID()
	b.fail(t, job, "openapi_job", 1, "timeout", "upstream timed out")
	b.failed(t, contract.FailedData{Kind: contract.KindJob, ID: dead, Attempt: 1, JobType: "openapi_dead", MaxRetries: new(0),
		Error: contract.ErrorInfo{Class: "timeout", Message: "upstream timed out"}})
	c.waitFor("/v1/jobs/"+job, "viewer", status200(`"status":"retrying"`))
	c.waitFor("/v1/jobs/"+dead, "viewer", status200(`"status":"failed_max_retries"`))
	// And a held one, whose answers carry every field of its hold.
	heldJob, heldUntil := contract.NewID(), time.Now().Add(time.Hour).UTC()
	b.held(t, contract.HeldData{Kind: contract.KindJob, ID: heldJob, Attempt: 1, JobType: "openapi_held", Reason: contract.HoldThrottle,
		Until: &heldUntil, HoldKey: "openapi_key", Detail: "openapi test"})
	c.waitFor("/v1/retries/job/"+heldJob, "viewer", status200(`"max_hold_at":`))
	var opID string
	c.run(
		apiCall{method: get, path: "/v1/retries", as: "viewer", want: ok},
		apiCall{method: get, path: "/v1/retries?kind=job&state=scheduled&job_type=openapi_job&limit=10", as: "viewer", want: ok},
		apiCall{method: get, path: "/v1/retries?kind=job&job_type=openapi_held", as: "viewer", want: ok},
		apiCall{method: get, path: "/v1/retries/job/" + heldJob, as: "viewer", want: ok},
		apiCall{method: get, path: "/v1/retries?limit=0", as: "viewer", want: http.StatusBadRequest, refused: true},
		apiCall{method: get, path: "/v1/retries", want: http.StatusUnauthorized, refused: true},
		apiCall{method: get, path: "/v1/retries/job/" + job, as: "viewer", want: ok},
		apiCall{method: get, path: "/v1/retries/job/job-missing", as: "viewer", want: http.StatusNotFound},
		apiCall{method: post, path: "/v1/retries/job/" + job + "/cancel", as: "admin", body: `{"reason":"openapi test"}`, want: ok},
		apiCall{method: post, path: "/v1/retries/job/" + job + "/cancel", as: "admin", want: http.StatusConflict},
		apiCall{method: post, path: "/v1/retries/job/" + job + "/retry", as: "admin", body: `{"reason":"openapi test","reset_attempts":true}`, want: ok},
		apiCall{method: post, path: "/v1/retries/job/" + job + "/retry", as: "viewer", want: http.StatusForbidden},
		apiCall{method: get, path: "/v1/jobs", as: "viewer", want: ok},
		apiCall{method: get, path: "/v1/jobs?status=retrying,failed_max_retries&jobType=openapi_job&min_retry_count=0", as: "viewer", want: ok},
		apiCall{method: get, path: "/v1/jobs?status=lost", as: "viewer", want: http.StatusBadRequest},
		apiCall{method: get, path: "/v1/jobs/" + job, as: "viewer", want: ok},
		apiCall{method: get, path: "/v1/jobs/job-missing", as: "viewer", want: http.StatusNotFound},
		apiCall{method: post, path: "/v1/jobs/" + job + "/retry", as: "admin", body: `{"reason":"openapi test","error_class":"timeout"}`, want: accepted},
		apiCall{method: post, path: "/v1/jobs/" + job + "/cancel", as: "admin", want: accepted},
		apiCall{method: post, path: "/v1/jobs/" + job + "/cancel", as: "admin", body: `{"reset_attempts":true}`, want: http.StatusBadRequest},
		apiCall{method: get, path: "/v1/analytics/retries", as: "viewer", want: ok},
		apiCall{method: get, path: "/v1/analytics/retries?kind=job&days=30&top=5", as: "viewer", want: ok},
		apiCall{method: get, path: "/v1/analytics/retries?days=0", as: "viewer", want: http.StatusBadRequest, refused: true},
		apiCall{method: post, path: "/v1/jobs/bulk-retry", as: "admin", body: `{"filter":{"job_type":"openapi_dead"},"dry_run":true}`, want: ok},
		apiCall{method: post, path: "/v1/jobs/bulk-retry", as: "admin", body: `{"filter":{"job_type":"openapi_dead"}}`, want: http.StatusBadRequest, refused: true},
		apiCall{method: post, path: "/v1/jobs/bulk-retry", as: "admin", want: accepted,
			body: `{"filter":{"status":["failed_max_retries"],"job_type":"openapi_dead"},"dry_run":false,"rate_per_second":1,"reason":"openapi test"}`,
			keep: func(body []byte) { opID = jsonString(t, body, "operation", "id") }},
	)
	c.run(
		apiCall{method: post, path: "/v1/jobs", as: "producer", body: `{"job_type":"openapi_job","payload":{"n":1},"priority":"high"}`, want: accepted},
		apiCall{method: post, path: "/v1/jobs", as: "producer", body: `{"id":"openapi-later","job_type":"openapi_job","run_at":"2999-01-01T00:00:00Z"}`, want: http.StatusBadRequest},
		apiCall{method: post, path: "/v1/jobs", as: "producer", body: `{"id":"openapi-later","job_type":"openapi_job","run_at":"` + time.Now().Add(time.Hour).UTC().Format(time.RFC3339) + `"}`, want: accepted},
		apiCall{method: post, path: "/v1/jobs", as: "producer", body: `{"id":"openapi-later","job_type":"openapi_job","run_at":"` + time.Now().Add(time.Hour).UTC().Format(time.RFC3339) + `"}`, want: ok},
		apiCall{method: post, path: "/v1/jobs", as: "producer", body: `{"job_type":"openapi_job","colour":"red"}`, want: http.StatusBadRequest, refused: true},
		apiCall{method: post, path: "/v1/jobs", as: "viewer", body: `{"job_type":"openapi_job"}`, want: http.StatusForbidden},
		apiCall{method: put, path: "/v1/schedules/openapi_job/hourly", as: "admin", body: `{"every":"1h","payload":{"n":2}}`, want: ok},
		apiCall{method: put, path: "/v1/schedules/openapi_job/hourly", as: "admin", body: `{"every":"10ms"}`, want: http.StatusBadRequest},
		apiCall{method: put, path: "/v1/schedules/openapi_job/hourly", as: "producer", body: `{"every":"1h"}`, want: http.StatusForbidden},
		apiCall{method: get, path: "/v1/schedules", as: "viewer", want: ok},
		apiCall{method: get, path: "/v1/schedules/openapi_job/hourly", as: "viewer", want: ok},
		apiCall{method: del, path: "/v1/schedules/openapi_job/hourly", as: "admin", want: noContent},
		apiCall{method: get, path: "/v1/schedules/openapi_job/hourly", as: "viewer", want: http.StatusNotFound},
		apiCall{method: del, path: "/v1/schedules/openapi_job/hourly", as: "admin", want: http.StatusNotFound},
		apiCall{method: get, path: "/v1/operations", as: "viewer", want: ok},
		apiCall{method: get, path: "/v1/operations?status=lost", as: "viewer", want: http.StatusBadRequest, refused: true},
		apiCall{method: get, path: "/v1/operations/" + opID, as: "viewer", want: ok},
		apiCall{method: post, path: "/v1/operations/" + opID + "/cancel", as: "admin", want: ok},
		apiCall{method: get, path: "/v1/operations/op-missing", as: "viewer", want: http.StatusNotFound},
		apiCall{method: get, path: "/ui/api/summary", as: "viewer", want: ok},
		apiCall{method: get, path: "/v1/audit", as: "admin", want: ok},
		apiCall{method: get, path: "/v1/audit?principal=admin&limit=5", as: "admin", want: ok},
		apiCall{method: get, path: "/v1/audit?colour=red", as: "admin", want: http.StatusBadRequest},
	)

	require.Empty(t, c.unexercised(), "operations of the spec no call exercised")
}
