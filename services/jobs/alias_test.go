package jobs_test

import (
	"testing"
	"time"

	"github.com/stretchr/testify/require"

	"github.com/retryd/retryd/services/jobs"
	"github.com/retryd/retryd/stores/jobstore"
)

// The puppet retry API's names (docs/jobs.md, "Puppet API names") are
// aliases of retryd's: each test gives the alias alone, with the same
// canonical value, and with a different one (refused, naming both).

func jobIDs(p jobstore.Page) []string {
	ids := make([]string, 0, len(p.Jobs))
	for _, j := range p.Jobs {
		ids = append(ids, j.ID)
	}
	return ids
}

func TestAPIAliasJobType(t *testing.T) {
	t.Parallel()
	// The jobs are created now (the column's default), within days=30.
	b := setupAPI(t, jobs.APIConfig{})
	b.insertJob(t, "l1", "linkedin_outreach", "failed", "timeout", 1, t0)
	b.insertJob(t, "e1", "email_campaign", "failed", "timeout", 1, t0)

	require.Equal(t, []string{"l1"}, jobIDs(b.list(t, "/v1/jobs?jobType=linkedin_outreach")))
	require.Equal(t, []string{"l1"}, jobIDs(b.list(t, "/v1/jobs?jobType=linkedin_outreach&job_type=linkedin_outreach")),
		"the same value under both names is fine")

	var res jobstore.Analytics
	require.Equal(t, 200, b.do(t, "GET", "/v1/analytics/retries?jobType=linkedin_outreach&days=30", "", &res))
	require.Len(t, res.JobTypes, 1)
	require.Equal(t, "linkedin_outreach", res.JobTypes[0].JobType)

	for _, path := range []string{
		"/v1/jobs?jobType=linkedin_outreach&job_type=email_campaign",
		"/v1/analytics/retries?jobType=linkedin_outreach&job_type=email_campaign",
	} {
		code, e := b.errorOf(t, "GET", path, "")
		require.Equal(t, 400, code, path)
		require.Equal(t, "job_type", e.Field, path)
		require.Contains(t, e.Message, "jobType", path)
	}
	code, e := b.errorOf(t, "GET", "/v1/jobs?jobType=Bad.Type", "")
	require.Equal(t, 400, code)
	require.Equal(t, "job_type", e.Field, "the alias is validated as job_type")
}

func TestAPIAliasPermanentlyFailed(t *testing.T) {
	t.Parallel()
	b := setupAPI(t, jobs.APIConfig{})
	b.insertJob(t, "f", "email_campaign", "failed", "validation", 0, t0)
	b.insertJob(t, "m", "email_campaign", "failed_max_retries", "timeout", 6, t0.Add(time.Minute))
	b.insertJob(t, "c", "email_campaign", "cancelled", "timeout", 2, t0.Add(2*time.Minute))
	b.insertJob(t, "r", "email_campaign", "retrying", "timeout", 2, t0.Add(3*time.Minute))
	b.insertJob(t, "ok", "email_campaign", "completed", "", 0, t0.Add(4*time.Minute))

	require.Equal(t, []string{"m", "f"}, jobIDs(b.list(t, "/v1/jobs?status=permanently_failed")), "failed and failed_max_retries, not cancelled")
	require.Equal(t, []string{"c", "m"}, jobIDs(b.list(t, "/v1/jobs?status=permanently_failed,cancelled&min_retry_count=1")))

	var dry jobs.DryRunResponse
	require.Equal(t, 200, b.do(t, "POST", "/v1/jobs/bulk-retry", `{"filter":{"status":"permanently_failed"},"dry_run":true}`, &dry))
	require.Equal(t, jobs.DryRunResponse{DryRun: true, Matched: 2}, dry)

	code, e := b.errorOf(t, "GET", "/v1/jobs?status=permanently_broken", "")
	require.Equal(t, 400, code)
	require.Equal(t, "status", e.Field)
	require.Contains(t, e.Message, "permanently_failed", "the refusal lists the alias too")
}

func TestAPIAliasErrorType(t *testing.T) {
	t.Parallel()
	b := setupAPI(t, jobs.APIConfig{})

	var ok jobs.ActionResponse
	require.Equal(t, 202, b.do(t, "POST", "/v1/jobs/j1/retry", `{"reason":"manual_retry","errorType":"temporary_error"}`, &ok))
	require.Equal(t, jobs.ActionResponse{ID: "j1", Action: "retry", By: "local", Reason: "manual_retry", ErrorClass: "temporary"}, ok,
		"errorType is read as an error class: temporary_error is temporary")
	require.Equal(t, 202, b.do(t, "POST", "/v1/jobs/j2/retry", `{"error_class":"network","errorType":"NETWORK"}`, &ok))
	require.Equal(t, "network", ok.ErrorClass, "the same class under both names is fine")
	require.Equal(t, []string{
		"retry job/j1 by=local reset=false reason=manual_retry class=temporary",
		"retry job/j2 by=local reset=false reason= class=network",
	}, b.rec.Calls())

	for _, tc := range []struct {
		path, body   string
		field, quote string
	}{
		{"/v1/jobs/j1/retry", `{"errorType":"manual_intervention"}`, "errorType", "manual_intervention"},
		{"/v1/jobs/j1/retry", `{"error_class":"sometimes"}`, "error_class", "sometimes"},
		{"/v1/jobs/j1/retry", `{"error_class":"timeout","errorType":"network"}`, "error_class", "errorType"},
		{"/v1/jobs/j1/cancel", `{"errorType":"timeout"}`, "errorType", "retry only"},
	} {
		code, e := b.errorOf(t, "POST", tc.path, tc.body)
		require.Equal(t, 400, code, tc.body)
		require.Equal(t, tc.field, e.Field, tc.body)
		require.Contains(t, e.Message, tc.quote, tc.body)
	}
	require.Len(t, b.rec.Calls(), 2, "refused bodies never reach the scheduler")
}

// The analytics cover every kind by default; kind keeps one.
func TestAPIAnalyticsKind(t *testing.T) {
	t.Parallel()
	b := setupAPI(t, jobs.APIConfig{})
	// Created now (the columns' defaults), within the default 7 days.
	_, err := b.pool.Exec(b.ctx, `INSERT INTO retries (kind, item_id, state, attempt, retry_count, max_retries) VALUES
		('job', 'j1', 'exhausted', 3, 2, 2), ('event', 'ev1', 'succeeded', 2, 1, 5), ('event-trigger', 't1', 'scheduled', 1, 0, 5)`)
	require.NoError(t, err)

	var res jobstore.Analytics
	require.Equal(t, 200, b.do(t, "GET", "/v1/analytics/retries", "", &res))
	kinds := map[string]int64{}
	for _, k := range res.Kinds {
		kinds[k.Kind] = k.Items
	}
	require.Equal(t, map[string]int64{"job": 1, "event": 1, "event-trigger": 1}, kinds)

	require.Equal(t, 200, b.do(t, "GET", "/v1/analytics/retries?kind=event", "", &res))
	require.Len(t, res.Kinds, 1)
	require.Equal(t, "event", res.Kinds[0].Kind)
	require.Equal(t, int64(1), res.Kinds[0].Succeeded)
	require.Empty(t, res.JobTypes)

	code, e := b.errorOf(t, "GET", "/v1/analytics/retries?kind=Bad.Kind", "")
	require.Equal(t, 400, code)
	require.Equal(t, "kind", e.Field)
}
