package jobs_test

import (
	"cmp"
	"encoding/json"
	"fmt"
	"net/http"
	"strings"
	"testing"
	"time"

	"github.com/stretchr/testify/require"

	"github.com/retryd/retryd/internal/natstest"
	"github.com/retryd/retryd/internal/serve"
	"github.com/retryd/retryd/internal/servicetest"
	"github.com/retryd/retryd/pkg/contract"
	"github.com/retryd/retryd/services/jobs"
)

// enqueue posts a job with optional headers and decodes the answer.
func (b *apiBundle) enqueue(t *testing.T, body string, headers ...string) (int, jobs.EnqueueResponse, []byte) {
	t.Helper()
	resp, raw := servicetest.Request(t, b.ctx, http.MethodPost, b.srv.URL+"/v1/jobs", body, headers...)
	var out jobs.EnqueueResponse
	if resp.StatusCode < 300 {
		require.NoError(t, json.Unmarshal(raw, &out), string(raw))
	}
	return resp.StatusCode, out, raw
}

// jobMessages decodes the jobs stored on filter in JOBS.
func (b *apiBundle) jobMessages(t *testing.T, filter string) []contract.JobData {
	t.Helper()
	var out []contract.JobData
	for _, m := range natstest.Messages(t, b.ctx, b.js, contract.StreamJobs, filter) {
		_, job, err := contract.DecodeJob(m.Subject(), m.Data())
		require.NoError(t, err)
		out = append(out, job)
	}
	return out
}

// A job posted with an Idempotency-Key is published once however often
// the request is made: the key names the job.
func TestEnqueuePublishesOnceByIdempotencyKey(t *testing.T) {
	t.Parallel()
	b := setupAPI(t, jobs.APIConfig{})
	body := `{"job_type":"mail","payload":{"to":"a@example.com"},"priority":"high","max_retries":2}`
	status, first, raw := b.enqueue(t, body, jobs.HeaderIdempotencyKey, "order-42")
	require.Equal(t, http.StatusAccepted, status, string(raw))
	require.Equal(t, jobs.IdempotentJobID("mail", "order-42"), first.ID)
	require.Equal(t, "jobs.mail.high", first.Subject)
	require.False(t, first.Duplicate)

	status, again, raw := b.enqueue(t, body, jobs.HeaderIdempotencyKey, "order-42")
	require.Equal(t, http.StatusOK, status, string(raw))
	require.True(t, again.Duplicate)
	require.Equal(t, first.ID, again.ID)

	stored := b.jobMessages(t, "jobs.mail.high")
	require.Len(t, stored, 1)
	require.Equal(t, first.ID, stored[0].ID)
	require.Equal(t, 1, stored[0].Attempt)
	require.Equal(t, 2, *stored[0].MaxRetries)
	require.JSONEq(t, `{"to":"a@example.com"}`, string(stored[0].Payload))

	// Without a key or an id, each request is a job of its own.
	_, a, _ := b.enqueue(t, `{"job_type":"mail"}`)
	_, c, _ := b.enqueue(t, `{"job_type":"mail"}`)
	require.NotEqual(t, a.ID, c.ID)
	require.Len(t, b.jobMessages(t, "jobs.mail"), 2)
}

// run_at delays the first run: the job waits as a schedule on SCHEDULES,
// is refused a second time while it waits, and comes to JOBS once.
func TestEnqueueRunAtDelaysTheFirstRun(t *testing.T) {
	t.Parallel()
	b := setupAPI(t, jobs.APIConfig{})
	runAt := time.Now().Add(1500 * time.Millisecond).UTC().Format(time.RFC3339Nano)
	body := fmt.Sprintf(`{"id":"later-1","job_type":"report","run_at":%q}`, runAt)
	status, resp, raw := b.enqueue(t, body)
	require.Equal(t, http.StatusAccepted, status, string(raw))
	require.Equal(t, "delayed.report.later-1", resp.Subject)
	require.NotNil(t, resp.RunAt)
	require.Empty(t, b.jobMessages(t, "jobs.report"), "not before run_at")

	status, again, _ := b.enqueue(t, body)
	require.Equal(t, http.StatusOK, status)
	require.True(t, again.Duplicate)

	require.Eventually(t, func() bool { return len(b.jobMessages(t, "jobs.report")) > 0 }, wait, 50*time.Millisecond)
	stored := b.jobMessages(t, "jobs.report")
	require.Len(t, stored, 1)
	require.Equal(t, "later-1", stored[0].ID)
}

// unique_for holds an id unique beyond the duplicate window: a job the
// projection holds, younger than unique_for, is not published again.
func TestEnqueueUniqueForOutlivesTheDuplicateWindow(t *testing.T) {
	t.Parallel()
	b := setupAPI(t, jobs.APIConfig{})
	_, err := b.pool.Exec(b.ctx, `INSERT INTO jobs (job_id, job_type, created_at) VALUES ('nightly-2024-05-01', 'report', now() - interval '10 minutes')`)
	require.NoError(t, err)

	status, resp, raw := b.enqueue(t, `{"id":"nightly-2024-05-01","job_type":"report","unique_for":"24h"}`)
	require.Equal(t, http.StatusOK, status, string(raw))
	require.True(t, resp.Duplicate)
	require.Empty(t, b.jobMessages(t, "jobs.report"))

	status, resp, raw = b.enqueue(t, `{"id":"nightly-2024-05-01","job_type":"report","unique_for":"5m"}`)
	require.Equal(t, http.StatusAccepted, status, string(raw))
	require.False(t, resp.Duplicate)
	require.Len(t, b.jobMessages(t, "jobs.report"), 1)
}

// Malformed requests are 400s naming the field, an oversized one a 413,
// and none publishes anything.
func TestEnqueueRefusesBadRequests(t *testing.T) {
	t.Parallel()
	b := setupAPI(t, jobs.APIConfig{})
	far := time.Now().Add(400 * 24 * time.Hour).UTC().Format(time.RFC3339)
	for _, tc := range []struct {
		body, field string
		headers     []string
		status      int
	}{
		{body: `{"payload":{}}`, field: "job_type"},
		{body: `{"job_type":"Mail"}`, field: "job_type"},
		{body: `{"job_type":"mail","priority":"urgent"}`, field: "data.priority"},
		{body: `{"job_type":"mail","id":"a b"}`, field: "data.id"},
		{body: `{"job_type":"mail","timeout_ms":-1}`, field: "data.timeout_ms"},
		{body: `{"job_type":"mail","unique_for":"forever"}`, field: "unique_for"},
		{body: `{"job_type":"mail","run_at":"` + far + `"}`, field: "run_at"},
		{body: `{"job_type":"mail","attempt":2}`, field: "attempt"},
		{body: `{"job_type":"mail","id":"x"}`, field: jobs.HeaderIdempotencyKey, headers: []string{jobs.HeaderIdempotencyKey, "k"}},
		{body: `{"job_type":"mail"}`, field: jobs.HeaderIdempotencyKey, headers: []string{jobs.HeaderIdempotencyKey, strings.Repeat("k", 256)}},
		{body: `{"job_type":"mail","payload":"` + strings.Repeat("x", 70<<10) + `"}`, field: "body", status: http.StatusRequestEntityTooLarge},
	} {
		status, _, raw := b.enqueue(t, tc.body, tc.headers...)
		require.Equal(t, cmp.Or(tc.status, http.StatusBadRequest), status, "%s: %s", tc.body[:min(len(tc.body), 60)], raw)
		var e struct {
			Error struct{ Field string } `json:"error"`
		}
		require.NoError(t, json.Unmarshal(raw, &e))
		require.Equal(t, tc.field, e.Error.Field, string(raw))
	}
	require.Empty(t, b.jobMessages(t, "jobs.>"))
}

// A full JOBS (discard new) refuses the job: POST /v1/jobs answers 503
// with Retry-After, and JOBS holds every job answered 202 and none
// answered 503.
func TestEnqueueIntoFullJobsIs503(t *testing.T) {
	t.Parallel()
	b := setupAPI(t, jobs.APIConfig{})
	natstest.SetMaxBytes(t, b.ctx, b.js, contract.StreamJobs, 4<<10) // a few jobs; below what streams.Options allows

	accepted, refused := servicetest.FillUp(t, 2, func(id string) (*http.Response, []byte) {
		return servicetest.Request(t, b.ctx, http.MethodPost, b.srv.URL+"/v1/jobs", fmt.Sprintf(`{"id":%q,"job_type":"mail"}`, id))
	}, func(resp *http.Response, raw []byte) {
		require.Equal(t, serve.RetryAfterFull, resp.Header.Get("Retry-After"))
		var e serve.ErrorBody
		require.NoError(t, json.Unmarshal(raw, &e))
		require.Equal(t, serve.CodeUnavailable, e.Error.Code)
		require.Equal(t, serve.FullMessage, e.Error.Message)
	})
	var stored []string
	for _, j := range b.jobMessages(t, "jobs.mail") {
		stored = append(stored, j.ID)
	}
	require.Equal(t, accepted, stored)

	natstest.SetMaxBytes(t, b.ctx, b.js, contract.StreamJobs, 1<<20)
	status, out, raw := b.enqueue(t, fmt.Sprintf(`{"id":%q,"job_type":"mail"}`, refused[0]))
	require.Equal(t, http.StatusAccepted, status, string(raw))
	require.False(t, out.Duplicate, "the refused job was not stored")
}
