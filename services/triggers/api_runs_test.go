package triggers

import (
	"encoding/json"
	"net/http"
	"net/url"
	"testing"
	"time"

	"github.com/stretchr/testify/require"
)

// viewRunRow is a row of workflow_runs the run views test inserts directly.
type viewRunRow struct {
	id, workflow, trigger, status, class, message, node, executor string
	attempt, retries                                              int
	maxRetries                                                    *int
	requestedAt                                                   time.Time
	nextRetryAt                                                   *time.Time
}

func (b *bundle) insertViewRun(t *testing.T, r viewRunRow) {
	t.Helper()
	var errAt *time.Time
	if r.class != "" {
		at := r.requestedAt.Add(time.Second)
		errAt = &at
	}
	_, err := b.pool.Exec(b.ctx, `
		INSERT INTO workflow_runs (run_id, workflow, delivery_id, trigger_id, event_id, status, requested_at,
			attempt, retry_count, max_retries, current_node_id, last_error_class, last_error_message,
			last_error_timestamp, next_retry_at, executor, lease_expires_at)
		VALUES ($1::text, $2, 'd-' || $1::text, nullif($3::text, ''), 'e-' || $1::text, $4, $5::timestamptz, $6, $7, $8, $9, $10, $11,
			$12, $13, $14, $5::timestamptz + interval '5 minutes')`,
		r.id, r.workflow, r.trigger, r.status, r.requestedAt, max(r.attempt, 1), r.retries, r.maxRetries, r.node,
		r.class, r.message, errAt, r.nextRetryAt, r.executor)
	require.NoError(t, err)
}

func (b *bundle) insertViewStep(t *testing.T, runID, node string, order int, status string, attempts int, retryState, class, message, executor, output string) {
	t.Helper()
	_, err := b.pool.Exec(b.ctx, `
		INSERT INTO workflow_run_steps (run_id, step_id, reported_at, status, attempts, run_attempt, retry_state,
			last_error_class, last_error_message, executor, output, next_attempt_at)
		VALUES ($1, $2, now() - interval '1 hour' + $3::int * interval '1 second', $4, $5::int, $5::int, $6::text, $7, $8, $9,
			$10::jsonb, CASE WHEN $6::text = 'scheduled' THEN now() + interval '1 minute' END)`,
		runID, node, order, status, attempts, retryState, class, message, executor, viewJSON(output))
	require.NoError(t, err)
}

func viewJSON(s string) any {
	if s == "" {
		return nil
	}
	return s
}

type runListPage struct {
	Runs       []RunView `json:"runs"`
	NextCursor string    `json:"next_cursor"`
}

func listedRunIDs(p runListPage) []string {
	ids := make([]string, len(p.Runs))
	for i, r := range p.Runs {
		ids[i] = r.ID
	}
	return ids
}

func TestRunsAPI(t *testing.T) {
	t.Parallel()
	b := setup(t, false)
	base := time.Now().UTC().Add(-time.Hour).Truncate(time.Millisecond)
	next := base.Add(2 * time.Hour)
	three := 3
	runs := []viewRunRow{
		{id: "run-a", workflow: "onboard", trigger: "t-1", status: "completed", requestedAt: base},
		{id: "run-b", workflow: "onboard", trigger: "t-1", status: "retrying", class: "timeout", message: "crm timed out",
			node: "enrich", executor: "engine-1", attempt: 2, retries: 1, maxRetries: &three, requestedAt: base.Add(time.Minute), nextRetryAt: &next},
		{id: "run-c", workflow: "billing", trigger: "t-2", status: "failed_max_retries", class: "timeout", message: "gave up",
			attempt: 4, retries: 3, maxRetries: &three, requestedAt: base.Add(2 * time.Minute)},
		{id: "run-d", workflow: "billing", trigger: "t-2", status: "failed", class: "validation", message: "bad input",
			requestedAt: base.Add(3 * time.Minute)},
		{id: "run-e", workflow: "onboard", status: "in_progress", node: "start", requestedAt: base.Add(4 * time.Minute)},
	}
	for _, r := range runs {
		b.insertViewRun(t, r)
	}
	// Inserted out of order: the steps are shown in the order reported.
	b.insertViewStep(t, "run-b", "notify", 2, "completed", 1, "succeeded", "", "", "engine-2", `"sent"`)
	b.insertViewStep(t, "run-b", "fetch", 0, "completed", 2, "none", "", "", "engine-1", `{"rows": 3}`)
	b.insertViewStep(t, "run-b", "enrich", 1, "failed", 2, "scheduled", "timeout", "crm timed out", "engine-1", "")

	list := func(query string) runListPage {
		t.Helper()
		var p runListPage
		require.Equal(t, http.StatusOK, b.do(t, http.MethodGet, "/v1/runs"+query, nil, &p), query)
		return p
	}
	require.Equal(t, []string{"run-e", "run-d", "run-c", "run-b", "run-a"}, listedRunIDs(list("")), "newest first")
	require.Equal(t, []string{"run-e", "run-b", "run-a"}, listedRunIDs(list("?workflow=onboard")))
	require.Equal(t, []string{"run-d", "run-c"}, listedRunIDs(list("?trigger_id=t-2")))
	require.Equal(t, []string{"run-c", "run-b"}, listedRunIDs(list("?error_class=timeout")))
	require.Equal(t, []string{"run-d", "run-c"}, listedRunIDs(list("?status=permanently_failed")), "the alias is failed and failed_max_retries")
	require.Equal(t, []string{"run-e", "run-b"}, listedRunIDs(list("?status=retrying,in_progress")))
	require.Equal(t, []string{"run-e", "run-b"}, listedRunIDs(list("?status=retrying&status=in_progress")), "status may be repeated")
	require.Equal(t, []string{"run-b"}, listedRunIDs(list("?status=retrying&workflow=onboard&error_class=timeout&trigger_id=t-1")))
	require.Empty(t, list("?workflow=nothing").Runs)

	// Pages: two at a time, the cursor continues where the page ended.
	var seen []string
	cursor := ""
	for pages := 0; ; pages++ {
		require.Less(t, pages, 4)
		p := list("?limit=2&cursor=" + url.QueryEscape(cursor))
		seen = append(seen, listedRunIDs(p)...)
		if p.NextCursor == "" {
			break
		}
		cursor = p.NextCursor
	}
	require.Equal(t, []string{"run-e", "run-d", "run-c", "run-b", "run-a"}, seen)

	// A retrying run: every column, and its steps in the order reported.
	var d RunDetail
	require.Equal(t, http.StatusOK, b.do(t, http.MethodGet, "/v1/runs/run-b", nil, &d))
	r := d.Run
	require.Equal(t, "run-b", r.ID)
	require.Equal(t, "onboard", r.Workflow)
	require.Equal(t, "retrying", r.Status)
	require.Equal(t, "t-1", r.TriggerID)
	require.Equal(t, "d-run-b", r.DeliveryID)
	require.Equal(t, "e-run-b", r.EventID)
	require.Equal(t, 2, r.Attempt)
	require.Equal(t, 1, r.RetryCount)
	require.Equal(t, &three, r.MaxRetries)
	require.True(t, r.RetryEnabled)
	require.Equal(t, "enrich", r.CurrentNodeID)
	require.Equal(t, "timeout", r.LastErrorClass)
	require.Equal(t, "crm timed out", r.LastErrorMessage)
	require.NotNil(t, r.LastErrorTimestamp)
	require.WithinDuration(t, next, *r.NextRetryAt, time.Millisecond)
	require.Equal(t, "engine-1", r.Executor)
	require.NotNil(t, r.LeaseExpiresAt)
	require.WithinDuration(t, base.Add(time.Minute), r.RequestedAt, time.Millisecond)
	require.Nil(t, r.FinishedAt)
	require.Len(t, d.Steps, 3)
	require.Equal(t, []string{"fetch", "enrich", "notify"}, []string{d.Steps[0].Node, d.Steps[1].Node, d.Steps[2].Node})
	require.Equal(t, "completed", d.Steps[0].Status)
	require.JSONEq(t, `{"rows": 3}`, string(d.Steps[0].Output))
	require.Equal(t, 2, d.Steps[0].Attempts)
	require.Equal(t, "none", d.Steps[0].RetryState)
	enrich := d.Steps[1]
	require.Equal(t, "failed", enrich.Status)
	require.Equal(t, "scheduled", enrich.RetryState)
	require.NotNil(t, enrich.NextAttemptAt)
	require.Equal(t, 2, enrich.RunAttempt)
	require.Equal(t, "timeout", enrich.LastErrorClass)
	require.Equal(t, "crm timed out", enrich.LastErrorMessage)
	require.Equal(t, "engine-1", enrich.Executor)
	require.Nil(t, enrich.Output)
	require.Equal(t, "engine-2", d.Steps[2].Executor)
	require.JSONEq(t, `"sent"`, string(d.Steps[2].Output))

	// A run without steps has an empty list, not null.
	var raw map[string]json.RawMessage
	require.Equal(t, http.StatusOK, b.do(t, http.MethodGet, "/v1/runs/run-a", nil, &raw))
	require.JSONEq(t, `[]`, string(raw["steps"]))

	var e apiError
	require.Equal(t, http.StatusNotFound, b.do(t, http.MethodGet, "/v1/runs/run-nope", nil, &e))
	require.Equal(t, "not_found", e.Error.Code)
	require.Contains(t, e.Error.Message, "run run-nope")
}

func TestRunsAPIRefusesBadFilters(t *testing.T) {
	t.Parallel()
	b := setup(t, false)
	cases := []struct{ query, field, text string }{
		{"status=running", "status", `"running" is not one of requested, in_progress, retrying, completed, failed, failed_max_retries or permanently_failed`},
		{"status=failed,weird", "status", `"weird"`},
		{"workflow=Not%20A%20Token", "workflow", "lowercase"},
		{"trigger_id=has%20space", "trigger_id", ""},
		{"error_class=Time%20Out", "error_class", ""},
		{"limit=0", "limit", "between 1 and 500"},
		{"limit=501", "limit", "between 1 and 500"},
		{"limit=ten", "limit", "between 1 and 500"},
		{"cursor=not-a-cursor", "cursor", "not a cursor"},
		{"state=failed", "state", "not a known parameter"},
		{"workflow=a&workflow=b", "workflow", "once"},
	}
	for _, c := range cases {
		var e apiError
		require.Equal(t, http.StatusBadRequest, b.do(t, http.MethodGet, "/v1/runs?"+c.query, nil, &e), c.query)
		require.Equal(t, "invalid_input", e.Error.Code, c.query)
		require.Equal(t, c.field, e.Error.Field, c.query)
		require.Contains(t, e.Error.Message, c.text, c.query)
	}
	var e apiError
	require.Equal(t, http.StatusBadRequest, b.do(t, http.MethodGet, "/v1/runs/has%20space", nil, &e))
	require.Equal(t, "id", e.Error.Field)
	// The retry is the scheduler's (POST /v1/retries/run/{id}/retry): the
	// triggers API has no such route.
	require.Equal(t, http.StatusNotFound, b.do(t, http.MethodPost, "/v1/runs/run-a/retry", nil, nil))
}
