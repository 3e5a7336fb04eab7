package jobs_test

import (
	"testing"
	"time"

	"github.com/stretchr/testify/require"

	"github.com/retryd/retryd/pkg/contract"
	"github.com/retryd/retryd/services/jobs"
)

// The projection stores each job's priority band: from its job message on
// jobs.<job_type>.high or .low (a job on jobs.<job_type> is normal), kept
// through a failure without one and through its retry.
func TestProjectorStoresThePriority(t *testing.T) {
	t.Parallel()
	b := setup(t)
	b.startProjector(t, jobs.ProjectorConfig{})
	b.publishJob(t, contract.JobData{ID: "p-high", JobType: "email", Attempt: 1, Priority: contract.PriorityHigh}, t0)
	b.publishJob(t, contract.JobData{ID: "p-low", JobType: "email", Attempt: 1, Priority: contract.PriorityLow}, t0)
	b.publishJob(t, contract.JobData{ID: "p-none", JobType: "email", Attempt: 1}, t0)
	// A failure from an owner that does not send the band leaves it; the
	// retry, routed with the band, keeps it.
	b.publishEvent(t, contract.Failed, contract.FailedData{Kind: "job", ID: "p-high", Attempt: 1, JobType: "email",
		Error: contract.ErrorInfo{Class: "network", Message: "reset"}}, t0.Add(time.Second))
	b.publishJob(t, contract.JobData{ID: "p-high", JobType: "email", Attempt: 2, Priority: contract.PriorityHigh}, t0.Add(2*time.Second))
	// A job the projection first hears of by its failure takes the
	// failure's band.
	b.publishEvent(t, contract.Failed, contract.FailedData{Kind: "job", ID: "p-fail", Attempt: 1, JobType: "email", Priority: contract.PriorityLow,
		Error: contract.ErrorInfo{Class: "network", Message: "reset"}}, t0)
	b.waitApplied(t, b.reg, 4, 2)

	for id, want := range map[string]string{"p-high": "high", "p-low": "low", "p-none": "normal", "p-fail": "low"} {
		require.Equal(t, want, b.job(t, id).Priority, id)
	}
	require.Equal(t, 2, b.job(t, "p-high").Attempt)
}

// The API shows a job's priority and filters on it; a priority that is
// not a band is a 400 naming the field.
func TestAPIListsThePriority(t *testing.T) {
	t.Parallel()
	b := setupAPI(t, jobs.APIConfig{})
	b.insertJob(t, "a", "email_campaign", "failed", "timeout", 1, t0)
	b.insertJob(t, "b", "email_campaign", "failed", "timeout", 1, t0.Add(time.Minute))
	_, err := b.pool.Exec(b.ctx, `UPDATE jobs SET priority = 'high' WHERE job_id = 'b'`)
	require.NoError(t, err)

	page := b.list(t, "/v1/jobs")
	require.Len(t, page.Jobs, 2)
	require.Equal(t, "high", page.Jobs[0].Priority)
	require.Equal(t, "normal", page.Jobs[1].Priority)
	require.Equal(t, []string{"b"}, jobIDs(b.list(t, "/v1/jobs?priority=high")))
	require.Empty(t, b.list(t, "/v1/jobs?priority=low").Jobs)

	var detail jobs.JobDetail
	require.Equal(t, 200, b.do(t, "GET", "/v1/jobs/b", "", &detail))
	require.Equal(t, "high", detail.Job.Priority)

	for _, p := range []string{"urgent", "HIGH", "5"} {
		code, e := b.errorOf(t, "GET", "/v1/jobs?priority="+p, "")
		require.Equal(t, 400, code, p)
		require.Equal(t, "priority", e.Field, p)
	}
}
