package jobstore_test

import (
	"testing"
	"time"

	"github.com/stretchr/testify/require"

	"github.com/retryd/retryd/stores/jobstore"
)

// seedAnalytics inserts a fixed data set; the expected figures in
// TestRetryAnalytics are computed by hand from it.
func (b *bundle) seedAnalytics(t *testing.T) {
	t.Helper()
	day := time.Date(2024, 5, 2, 10, 0, 0, 0, time.UTC)
	sec := func(s int) time.Time { return day.Add(time.Duration(s) * time.Second) }
	jobs := []struct {
		id, typ, status  string
		attempt, retries int
		created          time.Time
		completed        *time.Time
	}{
		{"e1", "email_campaign", "completed", 1, 0, sec(0), new(sec(10))},
		{"e2", "email_campaign", "completed", 3, 2, sec(0), new(sec(60))},
		{"e3", "email_campaign", "completed", 2, 1, sec(0), new(sec(30))},
		{"e4", "email_campaign", "failed_max_retries", 5, 4, sec(0), nil},
		{"e5", "email_campaign", "failed", 1, 0, sec(0), nil},
		{"e6", "email_campaign", "retrying", 2, 1, sec(0), nil},
		{"e7", "email_campaign", "completed", 1, 0, sec(0), new(sec(20))},
		{"e-old", "email_campaign", "completed", 1, 0, day.AddDate(0, 0, -12), new(day.AddDate(0, 0, -12))},
		{"d1", "data_enrichment", "in_progress", 1, 0, sec(5), nil},
		{"d2", "data_enrichment", "cancelled", 2, 1, sec(5), nil},
	}
	for _, j := range jobs {
		_, err := b.pool.Exec(b.ctx, `INSERT INTO jobs (job_id, job_type, status, attempt, retry_count, created_at, completed_at)
VALUES ($1, $2, $3, $4, $5, $6, $7)`, j.id, j.typ, j.status, j.attempt, j.retries, j.created, j.completed)
		require.NoError(t, err)
	}
	history := []struct {
		kind, id, event, typ, class, msg string
		at                               time.Time
	}{
		{"job", "e2", "failed", "email_campaign", "timeout", "timed out after 3000ms", sec(1)},
		{"job", "e2", "failed", "email_campaign", "timeout", "timed out after 3500ms", sec(20)},
		{"job", "e3", "failed", "email_campaign", "timeout", "timed out after 120ms", sec(1)},
		{"job", "e5", "failed", "email_campaign", "validation", "user 01HZX3K5Q8V2N4M6P7R9S0T1W2 rejected: invalid email bob@example.com", sec(1)},
		{"job", "e4", "failed", "email_campaign", "temporary", "HTTP 503 from https://api.mail.example.com/v1/send?id=9", sec(1)},
		{"job", "e4", "failed", "email_campaign", "temporary", "HTTP 503 from https://api.mail.example.com/v1/send?id=9", sec(2)},
		{"job", "e4", "failed", "email_campaign", "temporary", "HTTP 502 from https://api.mail.example.com/v1/send?id=9", sec(3)},
		{"job", "e4", "failed", "email_campaign", "temporary", "HTTP 503 from https://api.mail.example.com/v1/send?id=9", sec(4)},
		{"job", "e4", "failed", "email_campaign", "network", "HTTP 503 from https://api.mail.example.com/v1/send?id=10", sec(5)},
		{"job", "d2", "failed", "data_enrichment", "rate_limit", "rate limit exceeded, retry in 30s", sec(6)},
		// Not counted: another event, another kind, outside the period.
		{"job", "e2", "scheduled", "email_campaign", "timeout", "", sec(1)},
		{"event", "ev1", "failed", "email_campaign", "timeout", "timed out after 1ms", sec(1)},
		{"job", "e-old", "failed", "email_campaign", "timeout", "timed out after 1ms", day.AddDate(0, 0, -12)},
	}
	for _, h := range history {
		_, err := b.pool.Exec(b.ctx, `INSERT INTO retry_history (kind, item_id, attempt, event, job_type, error_class, error_message, at)
VALUES ($1, $2, 1, $3, $4, $5, $6, $7)`, h.kind, h.id, h.event, h.typ, h.class, h.msg, h.at)
		require.NoError(t, err)
	}
}

func TestRetryAnalytics(t *testing.T) {
	t.Parallel()
	b := setup(t)
	b.seedAnalytics(t)
	since := time.Date(2024, 5, 1, 0, 0, 0, 0, time.UTC)
	until := since.AddDate(0, 0, 7)

	got, err := jobstore.RetryAnalytics(b.ctx, b.pool, jobstore.AnalyticsQuery{Since: since, Until: until, TopErrors: 2})
	require.NoError(t, err)
	require.Len(t, got.JobTypes, 2)

	d := got.JobTypes[0]
	require.Equal(t, "data_enrichment", d.JobType)
	require.Equal(t, int64(2), d.TotalJobs)
	require.Equal(t, map[jobstore.Status]int64{"in_progress": 1, "cancelled": 1}, d.ByStatus)
	require.Zero(t, d.Succeeded)
	require.Zero(t, d.Failed)
	require.Nil(t, d.SuccessRate)
	require.Nil(t, d.AvgAttemptsToSuccess)
	require.Equal(t, jobstore.Percentiles{}, d.TimeToSuccessMS)
	require.Equal(t, int64(1), d.TotalRetries)
	require.Equal(t, int64(1), d.RetriedJobs)
	require.Nil(t, d.RetrySuccessRate)
	require.Equal(t, []jobstore.RetryBucket{{0, 1}, {1, 1}}, d.RetryDistribution)
	require.Equal(t, []jobstore.ClassCount{{"rate_limit", 1}}, d.ErrorsByClass)
	require.Equal(t, []jobstore.ErrorPattern{{"rate limit exceeded, retry in <n>s", "rate_limit", 1}}, d.TopErrors)

	e := got.JobTypes[1]
	require.Equal(t, "email_campaign", e.JobType)
	// e1..e7; e-old was created before the period.
	require.Equal(t, int64(7), e.TotalJobs)
	require.Equal(t, map[jobstore.Status]int64{"completed": 4, "failed_max_retries": 1, "failed": 1, "retrying": 1}, e.ByStatus)
	require.Equal(t, int64(4), e.Succeeded)
	require.Equal(t, int64(2), e.Failed)
	require.InDelta(t, 4.0/6.0, *e.SuccessRate, 1e-9)
	require.InDelta(t, (1+3+2+1)/4.0, *e.AvgAttemptsToSuccess, 1e-9)
	// Times to success 10s, 20s, 30s, 60s; continuous percentiles at
	// positions 1.5, 2.7 and 2.97 of the sorted list.
	require.InDelta(t, 25000, *e.TimeToSuccessMS.P50, 1e-6)
	require.InDelta(t, 51000, *e.TimeToSuccessMS.P90, 1e-6)
	require.InDelta(t, 59100, *e.TimeToSuccessMS.P99, 1e-6)
	require.Equal(t, int64(0+2+1+4+0+1+0), e.TotalRetries)
	require.Equal(t, int64(4), e.RetriedJobs)      // e2 e3 e4 e6
	require.Equal(t, int64(2), e.RetriedSucceeded) // e2 e3
	require.InDelta(t, 2.0/3.0, *e.RetrySuccessRate, 1e-9)
	require.Equal(t, []jobstore.RetryBucket{{0, 3}, {1, 2}, {2, 1}, {4, 1}}, e.RetryDistribution)
	require.Equal(t, []jobstore.ClassCount{{"temporary", 4}, {"timeout", 3}, {"network", 1}, {"validation", 1}}, e.ErrorsByClass)
	require.Equal(t, []jobstore.ErrorPattern{
		{"HTTP <n> from https://api.mail.example.com/<path>", "temporary", 5},
		{"timed out after <n>ms", "timeout", 3},
	}, e.TopErrors)

	one, err := jobstore.RetryAnalytics(b.ctx, b.pool, jobstore.AnalyticsQuery{Since: since, Until: until, JobType: "email_campaign"})
	require.NoError(t, err)
	require.Len(t, one.JobTypes, 1)
	require.Len(t, one.JobTypes[0].TopErrors, 3)
	require.Equal(t, "user <id> rejected: invalid email <email>", one.JobTypes[0].TopErrors[2].Pattern)

	empty, err := jobstore.RetryAnalytics(b.ctx, b.pool, jobstore.AnalyticsQuery{Since: until, Until: until.AddDate(0, 0, 1)})
	require.NoError(t, err)
	require.Empty(t, empty.JobTypes)

	_, err = jobstore.RetryAnalytics(b.ctx, b.pool, jobstore.AnalyticsQuery{Since: until, Until: since})
	require.Error(t, err)
}

func TestNormalizeError(t *testing.T) {
	t.Parallel()
	b := setup(t)
	for in, want := range map[string]string{
		"Timeout after 3000ms calling https://api.linkedin.com/v2/people/12345?x=1": "Timeout after <n>ms calling https://api.linkedin.com/<path>",
		"order 550e8400-e29b-41d4-a716-446655440000 rejected":                       "order <id> rejected",
		"invalid email bob@example.com at 2024-05-01T10:00:00Z":                     "invalid email <email> at <time>",
		"object 507f1f77bcf86cd799439011 missing":                                   "object <id> missing",
		"job 01HZX3K5Q8V2N4M6P7R9S0T1W2 failed:  ch_1J2k3L4m5N6o7P8q declined":      "job <id> failed: <id> declined",
		"  ETIMEDOUT\n\tconnecting  ":                                               "ETIMEDOUT connecting",
		"rate 1.5 exceeded":                                                         "rate <n> exceeded",
	} {
		var got string
		require.NoError(t, b.pool.QueryRow(b.ctx, `SELECT retryd_normalize_error($1)`, in).Scan(&got))
		require.Equal(t, want, got, in)
	}
}

// The per-kind figures cover every kind the scheduler retries, from the
// retries and retry_history tables; Kind keeps one of them, and per job
// type figures exist for kind job only.
func TestRetryAnalyticsKinds(t *testing.T) {
	t.Parallel()
	b := setup(t)
	b.seedAnalytics(t)
	day := time.Date(2024, 5, 2, 10, 0, 0, 0, time.UTC)
	for _, r := range []struct {
		kind, id, state, typ string
		retries              int
		created              time.Time
	}{
		{"job", "e2", "succeeded", "email_campaign", 2, day},
		{"job", "e4", "exhausted", "email_campaign", 4, day},
		{"job", "e6", "scheduled", "email_campaign", 1, day},
		{"event", "ev1", "succeeded", "", 1, day},
		{"event", "ev2", "exhausted", "", 3, day},
		{"event", "ev3", "succeeded", "", 0, day},
		{"event", "ev-old", "succeeded", "", 1, day.AddDate(0, 0, -12)},
	} {
		_, err := b.pool.Exec(b.ctx, `INSERT INTO retries (kind, item_id, state, attempt, retry_count, max_retries, job_type, created_at)
VALUES ($1, $2, $3, $4, $4, 5, $5, $6)`, r.kind, r.id, r.state, r.retries, r.typ, r.created)
		require.NoError(t, err)
	}
	since := time.Date(2024, 5, 1, 0, 0, 0, 0, time.UTC)
	until := since.AddDate(0, 0, 7)

	got, err := jobstore.RetryAnalytics(b.ctx, b.pool, jobstore.AnalyticsQuery{Since: since, Until: until})
	require.NoError(t, err)
	require.Len(t, got.Kinds, 2)
	ev, job := got.Kinds[0], got.Kinds[1]
	require.Equal(t, "event", ev.Kind)
	require.Equal(t, int64(3), ev.Items, "ev-old had its first failure before the period")
	require.Equal(t, map[string]int64{"succeeded": 2, "exhausted": 1}, ev.ByState)
	require.Equal(t, int64(2), ev.Succeeded)
	require.Equal(t, int64(1), ev.Exhausted)
	require.InDelta(t, 2.0/3.0, *ev.SuccessRate, 1e-9)
	require.Equal(t, int64(4), ev.TotalRetries)
	require.Equal(t, int64(2), ev.RetriedItems)
	// The seed's one failed event attempt (ev1) is in the period.
	require.Equal(t, []jobstore.ClassCount{{"timeout", 1}}, ev.ErrorsByClass)

	require.Equal(t, "job", job.Kind)
	require.Equal(t, int64(3), job.Items)
	require.Equal(t, map[string]int64{"succeeded": 1, "exhausted": 1, "scheduled": 1}, job.ByState)
	require.InDelta(t, 0.5, *job.SuccessRate, 1e-9)
	require.Equal(t, int64(7), job.TotalRetries)
	require.Equal(t, []jobstore.ClassCount{{"temporary", 4}, {"timeout", 3}, {"network", 1}, {"rate_limit", 1}, {"validation", 1}}, job.ErrorsByClass)
	require.Len(t, got.JobTypes, 2, "all kinds include the per job type figures of jobs")

	events, err := jobstore.RetryAnalytics(b.ctx, b.pool, jobstore.AnalyticsQuery{Since: since, Until: until, Kind: "event"})
	require.NoError(t, err)
	require.Len(t, events.Kinds, 1)
	require.Equal(t, ev, events.Kinds[0])
	require.Empty(t, events.JobTypes, "per job type figures are of kind job")

	jobsOnly, err := jobstore.RetryAnalytics(b.ctx, b.pool, jobstore.AnalyticsQuery{Since: since, Until: until, Kind: "job"})
	require.NoError(t, err)
	require.Equal(t, []jobstore.KindAnalytics{job}, jobsOnly.Kinds)
	require.Len(t, jobsOnly.JobTypes, 2)

	typed, err := jobstore.RetryAnalytics(b.ctx, b.pool, jobstore.AnalyticsQuery{Since: since, Until: until, JobType: "data_enrichment"})
	require.NoError(t, err)
	require.Len(t, typed.Kinds, 1, "a job type keeps the kinds that have it")
	require.Equal(t, "job", typed.Kinds[0].Kind)
	require.Zero(t, typed.Kinds[0].Items)
	require.Equal(t, []jobstore.ClassCount{{"rate_limit", 1}}, typed.Kinds[0].ErrorsByClass)
}
