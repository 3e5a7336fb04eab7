package jobs_test

import (
	"context"
	"encoding/json"
	"fmt"
	"net/http/httptest"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/stretchr/testify/require"

	"github.com/retryd/retryd/internal/audit"
	"github.com/retryd/retryd/internal/serve"
	"github.com/retryd/retryd/internal/servicetest"
	"github.com/retryd/retryd/migrations/pgtest"
	"github.com/retryd/retryd/services/jobs"
	"github.com/retryd/retryd/stores/jobstore"
	"github.com/retryd/retryd/stores/pgdb"
)

// recorder is a RetryController that records the calls it gets and
// answers with the error set for a job id, as the scheduler would for an
// unknown or finished item.
type recorder struct {
	mu     sync.Mutex
	calls  []string
	errors map[string]error
	// audited is, per call, the audit action it would be recorded as
	// and by whom ("-" for none: not asked for over the API).
	audited []string
}

func (r *recorder) record(ctx context.Context, call, id string) error {
	r.mu.Lock()
	defer r.mu.Unlock()
	r.calls = append(r.calls, call)
	who := "-"
	if p, ok := serve.PrincipalFrom(ctx); ok {
		who = p.Name
	}
	r.audited = append(r.audited, audit.ActionName(ctx, "-")+" by "+who)
	return r.errors[id]
}

func (r *recorder) RetryNow(ctx context.Context, kind, id, reason, by string, reset bool, class string) error {
	call := fmt.Sprintf("retry %s/%s by=%s reset=%t reason=%s", kind, id, by, reset, reason)
	if class != "" {
		call += " class=" + class
	}
	return r.record(ctx, call, id)
}

func (r *recorder) Cancel(ctx context.Context, kind, id, by, reason string) error {
	return r.record(ctx, fmt.Sprintf("cancel %s/%s by=%s reason=%s", kind, id, by, reason), id)
}

func (r *recorder) Audited() []string {
	r.mu.Lock()
	defer r.mu.Unlock()
	return append([]string(nil), r.audited...)
}

func (r *recorder) Calls() []string {
	r.mu.Lock()
	defer r.mu.Unlock()
	return append([]string(nil), r.calls...)
}

type apiBundle struct {
	*bundle
	rec *recorder
	srv *httptest.Server
	api *jobs.API
}

func setupAPI(t *testing.T, cfg jobs.APIConfig) *apiBundle {
	t.Helper()
	b := setup(t)
	rec := &recorder{errors: map[string]error{}}
	cfg.Pool, cfg.JS, cfg.Logger = b.pool, b.js, b.log
	if cfg.Retry == nil {
		cfg.Retry = rec
	}
	if cfg.ScanInterval == 0 {
		cfg.ScanInterval = 50 * time.Millisecond
	}
	api, err := jobs.NewAPI(cfg)
	require.NoError(t, err)
	srv := httptest.NewServer(serve.Guard{}.Handler(api.Handler()))
	t.Cleanup(srv.Close)
	return &apiBundle{bundle: b, rec: rec, srv: srv, api: api}
}

func (b *apiBundle) start(t *testing.T, api *jobs.API) {
	t.Helper()
	require.NoError(t, api.Start(b.ctx))
	t.Cleanup(func() { _ = api.Stop(context.Background()) })
}

// do sends a request and decodes the JSON answer into out (when not nil).
func (b *apiBundle) do(t *testing.T, method, path, body string, out any) int {
	t.Helper()
	resp, raw := servicetest.Request(t, t.Context(), method, b.srv.URL+path, body)
	require.Equal(t, "application/json", resp.Header.Get("Content-Type"), string(raw))
	if out != nil {
		require.NoError(t, json.Unmarshal(raw, out), string(raw))
	}
	return resp.StatusCode
}

// list answers GET path, a jobs list: it must answer 200.
func (b *apiBundle) list(t *testing.T, path string) jobstore.Page {
	t.Helper()
	var page jobstore.Page
	require.Equal(t, 200, b.do(t, "GET", path, "", &page), path)
	return page
}

func (b *apiBundle) errorOf(t *testing.T, method, path, body string) (int, serve.ErrorDetail) {
	t.Helper()
	var e serve.ErrorBody
	code := b.do(t, method, path, body, &e)
	return code, e.Error
}

func (b *apiBundle) insertJob(t *testing.T, id, typ, status, class string, retries int, updated time.Time) {
	t.Helper()
	_, err := b.pool.Exec(b.ctx, `INSERT INTO jobs (job_id, job_type, status, retry_count, last_error_class, updated_at)
VALUES ($1, $2, $3, $4, $5, $6)`, id, typ, status, retries, class, updated)
	require.NoError(t, err)
}

func TestAPIListAndGet(t *testing.T) {
	t.Parallel()
	b := setupAPI(t, jobs.APIConfig{})
	b.insertJob(t, "a", "email_campaign", "failed_max_retries", "timeout", 4, t0)
	b.insertJob(t, "b", "email_campaign", "failed_max_retries", "timeout", 1, t0.Add(time.Minute))
	b.insertJob(t, "c", "email_campaign", "completed", "", 0, t0.Add(2*time.Minute))
	b.insertJob(t, "d", "data_enrichment", "failed", "validation", 0, t0.Add(3*time.Minute))
	_, err := b.pool.Exec(b.ctx, `INSERT INTO retry_history (kind, item_id, attempt, event, job_type, error_class, error_message, delay_ms, decided_by)
VALUES ('job', 'a', 1, 'failed', 'email_campaign', 'timeout', 'timed out', NULL, ''),
       ('job', 'a', 2, 'scheduled', 'email_campaign', 'timeout', '', 1500, 'backoff')`)
	require.NoError(t, err)

	require.Equal(t, []string{"b", "a"}, jobIDs(b.list(t, "/v1/jobs?status=failed_max_retries,failed&min_retry_count=1")))
	page := b.list(t, "/v1/jobs?status=failed&status=completed&limit=1")
	require.Equal(t, []string{"d"}, jobIDs(page))
	require.NotEmpty(t, page.NextCursor)
	require.Equal(t, []string{"c"}, jobIDs(b.list(t, "/v1/jobs?status=failed&status=completed&limit=1&cursor="+page.NextCursor)))

	var detail jobs.JobDetail
	require.Equal(t, 200, b.do(t, "GET", "/v1/jobs/a", "", &detail))
	require.Equal(t, "a", detail.Job.ID)
	require.Len(t, detail.History, 2)
	require.Equal(t, "failed", detail.History[0].Event)
	require.Equal(t, int64(1500), *detail.History[1].DelayMS)

	for _, tc := range []struct {
		path  string
		code  int
		field string
	}{
		{"/v1/jobs?status=broken", 400, "status"},
		{"/v1/jobs?min_retry_count=-1", 400, "min_retry_count"},
		{"/v1/jobs?limit=5000", 400, "limit"},
		{"/v1/jobs?cursor=zzz", 400, "cursor"},
		{"/v1/jobs?since=yesterday", 400, "since"},
		{"/v1/jobs?job_type=Bad.Type", 400, "job_type"},
		{"/v1/jobs/nope", 404, ""},
		{"/v1/jobs/bad.id", 400, "id"},
		{"/v1/analytics/retries?days=0", 400, "days"},
		{"/v1/analytics/retries?days=3&since=2024-01-01T00:00:00Z", 400, "days"},
		{"/v1/analytics/retries?since=2024-01-02T00:00:00Z&until=2024-01-01T00:00:00Z", 400, "until"},
		{"/v1/analytics/retries?top=1000", 400, "top"},
	} {
		code, e := b.errorOf(t, "GET", tc.path, "")
		require.Equal(t, tc.code, code, tc.path)
		require.Equal(t, tc.field, e.Field, tc.path)
	}
}

func TestAPIAnalyticsPeriod(t *testing.T) {
	t.Parallel()
	now := time.Date(2024, 5, 10, 12, 0, 0, 0, time.UTC)
	b := setupAPI(t, jobs.APIConfig{Now: func() time.Time { return now }})
	_, err := b.pool.Exec(b.ctx, `INSERT INTO jobs (job_id, job_type, status, attempt, created_at, completed_at) VALUES
		('in', 'email_campaign', 'completed', 2, '2024-05-09T12:00:00Z', '2024-05-09T12:00:05Z'),
		('old', 'email_campaign', 'completed', 1, '2024-04-01T12:00:00Z', '2024-04-01T12:00:05Z')`)
	require.NoError(t, err)
	var res jobstore.Analytics
	require.Equal(t, 200, b.do(t, "GET", "/v1/analytics/retries?days=7&job_type=email_campaign", "", &res))
	require.Equal(t, now.AddDate(0, 0, -7), res.Since)
	require.Equal(t, now, res.Until)
	require.Len(t, res.JobTypes, 1)
	require.Equal(t, int64(1), res.JobTypes[0].TotalJobs)
	require.Equal(t, 5000.0, *res.JobTypes[0].TimeToSuccessMS.P50)
	require.Equal(t, 200, b.do(t, "GET", "/v1/analytics/retries?since=2024-03-01T00:00:00Z", "", &res))
	require.Equal(t, int64(2), res.JobTypes[0].TotalJobs)
}

func TestAPIRetryAndCancel(t *testing.T) {
	t.Parallel()
	b := setupAPI(t, jobs.APIConfig{MaxBodyBytes: 256})
	b.rec.errors["gone"] = fmt.Errorf("retry job/gone: %w", pgdb.ErrNotFound)
	b.rec.errors["done"] = fmt.Errorf("cancel job/done: it is in state succeeded, not pending: %w", pgdb.ErrConflict)

	var ok jobs.ActionResponse
	require.Equal(t, 202, b.do(t, "POST", "/v1/jobs/j1/retry", `{"reason":"provider fixed","reset_attempts":true}`, &ok))
	// by is the principal's name ("local" with authentication off), never
	// the body's.
	require.Equal(t, jobs.ActionResponse{ID: "j1", Action: "retry", By: "local", Reason: "provider fixed"}, ok)
	require.Equal(t, 202, b.do(t, "POST", "/v1/jobs/j1/cancel", "", &ok))
	require.Equal(t, 202, b.do(t, "POST", "/v1/jobs/j1/cancel", `{"by":"alice","reason":"customer left"}`, &ok))
	require.Equal(t, []string{
		"retry job/j1 by=local reset=true reason=provider fixed",
		"cancel job/j1 by=local reason=",
		"cancel job/j1 by=local reason=customer left",
	}, b.rec.Calls())
	require.Equal(t, []string{"job.retry by local", "job.cancel by local", "job.cancel by local"}, b.rec.Audited(),
		"the scheduler records them as job actions of the principal")

	for _, tc := range []struct {
		path, body string
		code       int
		field      string
	}{
		{"/v1/jobs/gone/retry", "", 404, ""},
		{"/v1/jobs/done/cancel", "", 409, ""},
		{"/v1/jobs/j1/retry", `{"reason":"x","extra":1}`, 400, "extra"},
		{"/v1/jobs/j1/retry", `{"reason":` + `"` + strings.Repeat("x", 300) + `"}`, 413, "body"},
		{"/v1/jobs/j1/cancel", `{"reset_attempts":true}`, 400, "reset_attempts"},
		{"/v1/jobs/j.1/retry", "", 400, "id"},
		{"/v1/jobs/j1/cancel", `{"reason":"nul\u0000"}`, 400, "reason"},
	} {
		code, e := b.errorOf(t, "POST", tc.path, tc.body)
		require.Equal(t, tc.code, code, tc.path+" "+tc.body)
		require.Equal(t, tc.field, e.Field, tc.path+" "+tc.body)
	}
	require.Len(t, b.rec.Calls(), 5, "invalid requests never reach the scheduler")
}

func TestAPIBulkRetry(t *testing.T) {
	t.Parallel()
	b := setupAPI(t, jobs.APIConfig{})
	for i := range 6 {
		status := "failed_max_retries"
		if i == 5 {
			status = "completed"
		}
		b.insertJob(t, fmt.Sprintf("j%d", i), "email_campaign", status, "timeout", 5, t0.Add(time.Duration(i)*time.Minute))
	}
	b.insertJob(t, "other", "data_enrichment", "failed_max_retries", "timeout", 5, t0)
	b.rec.errors["j2"] = fmt.Errorf("retry job/j2: %w", pgdb.ErrNotFound)

	var dry jobs.DryRunResponse
	filter := `"filter":{"status":"failed_max_retries","job_type":"email_campaign","error_class":"timeout"}`
	require.Equal(t, 200, b.do(t, "POST", "/v1/jobs/bulk-retry", `{`+filter+`,"dry_run":true}`, &dry))
	require.Equal(t, jobs.DryRunResponse{DryRun: true, Matched: 5}, dry)
	require.Empty(t, b.rec.Calls(), "a dry run retries nothing")

	var created jobs.OperationResponse
	require.Equal(t, 202, b.do(t, "POST", "/v1/jobs/bulk-retry", `{`+filter+`,"dry_run":false,"rate_per_second":50,"reason":"smtp back","by":"alice"}`, &created))
	op := created.Operation
	require.Equal(t, jobstore.OperationRunning, op.Status)
	require.Equal(t, 5, op.Total)
	require.True(t, strings.HasPrefix(op.ID, "op-"))

	// Nothing is released until the runner starts.
	b.start(t, b.api)
	var got jobs.OperationResponse
	require.Eventually(t, func() bool {
		b.do(t, "GET", "/v1/operations/"+op.ID, "", &got)
		return got.Operation.Status == jobstore.OperationCompleted
	}, wait, 20*time.Millisecond)
	require.Equal(t, []int{5, 4, 1, 0, 0}, []int{got.Operation.Total, got.Operation.Released, got.Operation.Skipped, got.Operation.Failed, got.Operation.Pending})
	require.Len(t, got.Problems, 1)
	require.Equal(t, "j2", got.Problems[0].JobID)
	reason := "bulk retry " + op.ID + ": smtp back"
	var want []string
	for i := range 5 {
		want = append(want, fmt.Sprintf("retry job/j%d by=local reset=false reason=%s", i, reason))
	}
	require.Equal(t, want, b.rec.Calls(), "oldest first, each once")
	for _, a := range b.rec.Audited() {
		require.Equal(t, "- by -", a, "the runner's retries are not API actions: the operation's entry covers them")
	}
	entries := pgtest.Strings(t, b.pool, `SELECT principal || ' ' || action || ' ' || target || ' ' || detail::text FROM audit_log ORDER BY id`)
	require.Equal(t, []string{`local job.bulk_retry operation/` + op.ID +
		` {"total": 5, "reason": "smtp back", "reset_attempts": false, "rate_per_second": 50}`}, entries,
		"one entry, for the operation, by the principal (not the body's by); dry runs and refused bodies record none")

	for _, tc := range []struct {
		body  string
		code  int
		field string
	}{
		{`{"filter":{}}`, 400, "dry_run"},
		{`{"filter":{"status":"nope"},"dry_run":true}`, 400, "filter.status"},
		{`{"filter":{},"dry_run":false,"rate_per_second":5000}`, 400, "rate_per_second"},
		{`{"filter":{},"dry_run":false,"rate_per_second":-1}`, 400, "rate_per_second"},
		{`{"filter":{"since":"2024-02-01T00:00:00Z","until":"2024-01-01T00:00:00Z"},"dry_run":true}`, 400, "filter.until"},
		{`{"filter":{},"dry_run":true,"surprise":1}`, 400, "surprise"},
		{`not json`, 400, "body"},
		{`{"filter":{},"dry_run":false,"reason":"nul\u0000"}`, 400, "reason"},
	} {
		code, e := b.errorOf(t, "POST", "/v1/jobs/bulk-retry", tc.body)
		require.Equal(t, tc.code, code, tc.body)
		require.Equal(t, tc.field, e.Field, tc.body)
	}
	code, _ := b.errorOf(t, "GET", "/v1/operations/op-missing", "")
	require.Equal(t, 404, code)
}

func TestBulkRetryResumesAfterItsRunnerDies(t *testing.T) {
	t.Parallel()
	b := setupAPI(t, jobs.APIConfig{Runner: "first", LeaseTTL: time.Second})
	for i := range 8 {
		b.insertJob(t, fmt.Sprintf("j%d", i), "email_campaign", "failed", "validation", 0, t0.Add(time.Duration(i)*time.Minute))
	}
	var created jobs.OperationResponse
	require.Equal(t, 202, b.do(t, "POST", "/v1/jobs/bulk-retry", `{"filter":{},"dry_run":false,"rate_per_second":10}`, &created))
	require.NoError(t, b.api.Start(b.ctx))
	require.Eventually(t, func() bool { return len(b.rec.Calls()) >= 3 }, wait, 5*time.Millisecond)
	require.NoError(t, b.api.Stop(b.ctx)) // the runner dies; the lease runs out

	second, err := jobs.NewAPI(jobs.APIConfig{Pool: b.pool, Retry: b.rec, JS: b.js, Logger: b.log, Runner: "second",
		LeaseTTL: time.Second, ScanInterval: 50 * time.Millisecond})
	require.NoError(t, err)
	b.start(t, second)
	require.Eventually(t, func() bool {
		op, err := jobstore.GetOperation(b.ctx, b.pool, created.Operation.ID)
		require.NoError(t, err)
		return op.Status == jobstore.OperationCompleted
	}, wait, 20*time.Millisecond)
	calls := b.rec.Calls()
	require.Len(t, calls, 8, "every job released exactly once across both runners: %v", calls)
	seen := map[string]bool{}
	for _, c := range calls {
		require.False(t, seen[c], "released twice: %s", c)
		seen[c] = true
	}
}

func TestBulkRetryCancel(t *testing.T) {
	t.Parallel()
	b := setupAPI(t, jobs.APIConfig{})
	for i := range 3 {
		b.insertJob(t, fmt.Sprintf("j%d", i), "email_campaign", "failed", "validation", 0, time.Now())
	}
	var created jobs.OperationResponse
	require.Equal(t, 202, b.do(t, "POST", "/v1/jobs/bulk-retry", `{"filter":{},"dry_run":false}`, &created))
	var cancelled jobs.OperationResponse
	require.Equal(t, 200, b.do(t, "POST", "/v1/operations/"+created.Operation.ID+"/cancel", "", &cancelled))
	require.Equal(t, jobstore.OperationCancelled, cancelled.Operation.Status)
	require.Equal(t, 3, cancelled.Operation.Pending)
	// No runner takes a cancelled operation.
	ids, err := jobstore.LeaseOperations(b.ctx, b.pool, "any", time.Minute)
	require.NoError(t, err)
	require.Empty(t, ids)
	require.Empty(t, b.rec.Calls())
}

// GET /v1/operations lists the bulk operations newest first, a page at a
// time, filtered by status; bad input names its field.
func TestListOperations(t *testing.T) {
	t.Parallel()
	b := setupAPI(t, jobs.APIConfig{})
	b.insertJob(t, "j0", "email_campaign", "failed", "validation", 0, time.Now())
	var ids []string
	for range 3 {
		var created jobs.OperationResponse
		require.Equal(t, 202, b.do(t, "POST", "/v1/jobs/bulk-retry", `{"filter":{},"dry_run":false}`, &created))
		ids = append(ids, created.Operation.ID)
	}
	require.Equal(t, 200, b.do(t, "POST", "/v1/operations/"+ids[1]+"/cancel", "", nil))

	var page jobstore.OperationPage
	require.Equal(t, 200, b.do(t, "GET", "/v1/operations?limit=2", "", &page))
	require.Len(t, page.Operations, 2)
	require.Equal(t, []string{ids[2], ids[1]}, []string{page.Operations[0].ID, page.Operations[1].ID}, "newest first")
	require.NotEmpty(t, page.NextCursor)
	var rest jobstore.OperationPage
	require.Equal(t, 200, b.do(t, "GET", "/v1/operations?limit=2&cursor="+page.NextCursor, "", &rest))
	require.Len(t, rest.Operations, 1)
	require.Equal(t, ids[0], rest.Operations[0].ID)
	require.Empty(t, rest.NextCursor, "the last page")

	var cancelled jobstore.OperationPage
	require.Equal(t, 200, b.do(t, "GET", "/v1/operations?status=cancelled", "", &cancelled))
	require.Len(t, cancelled.Operations, 1)
	require.Equal(t, ids[1], cancelled.Operations[0].ID)

	for query, field := range map[string]string{"status=done": "status", "limit=0": "limit", "cursor=nope": "cursor"} {
		code, e := b.errorOf(t, "GET", "/v1/operations?"+query, "")
		require.Equal(t, 400, code, query)
		require.Equal(t, field, e.Field, query)
	}
}

// blockingController holds the first RetryNow until released, as a slow
// scheduler would.
type blockingController struct {
	recorder
	entered chan struct{}
	release chan struct{}
	once    sync.Once
}

func (c *blockingController) RetryNow(ctx context.Context, kind, id, reason, by string, reset bool, class string) error {
	c.once.Do(func() {
		close(c.entered)
		<-c.release
	})
	return c.recorder.RetryNow(ctx, kind, id, reason, by, reset, class)
}

// A stop that comes while a job is being released lets that release
// finish and records it: otherwise the next runner would release the job a
// second time.
func TestBulkRetryStopRecordsTheReleaseInHand(t *testing.T) {
	t.Parallel()
	ctrl := &blockingController{entered: make(chan struct{}), release: make(chan struct{})}
	b := setupAPI(t, jobs.APIConfig{Retry: ctrl, Runner: "first"})
	b.insertJob(t, "j0", "email_campaign", "failed", "validation", 0, time.Now())
	var created jobs.OperationResponse
	require.Equal(t, 202, b.do(t, "POST", "/v1/jobs/bulk-retry", `{"filter":{},"dry_run":false}`, &created))
	require.NoError(t, b.api.Start(b.ctx))
	<-ctrl.entered

	// Stop gives up waiting at once; the release in hand goes on.
	ctx, cancel := context.WithCancel(b.ctx)
	cancel()
	require.Error(t, b.api.Stop(ctx))
	close(ctrl.release)
	require.Eventually(t, func() bool {
		op, err := jobstore.GetOperation(b.ctx, b.pool, created.Operation.ID)
		require.NoError(t, err)
		return op.Released == 1
	}, wait, 10*time.Millisecond, "the release that was in hand is recorded")
	require.Len(t, ctrl.Calls(), 1)
}
