package jobstore

import (
	"context"
	"fmt"
	"sort"
	"time"

	"github.com/jackc/pgx/v5"
)

// DefaultTopErrors is how many error patterns Analytics returns per job
// type unless told otherwise.
const DefaultTopErrors = 10

// AnalyticsQuery selects the period, kind and job type of Analytics.
type AnalyticsQuery struct {
	// Kind limits the result to one kind of retried work (job, event,
	// event-trigger or a custom kind); empty means every kind. Per job
	// type figures (Analytics.JobTypes) exist for kind job only.
	Kind string
	// JobType limits the result to one type; empty means every type.
	JobType string
	// Since (inclusive) and Until (exclusive) bound the period. Job figures
	// count jobs created in it; error figures count failures in it.
	Since, Until time.Time
	// TopErrors is how many error patterns to return per type (0 means
	// DefaultTopErrors).
	TopErrors int
}

// Analytics is the retry analytics of a period: one entry per kind of
// retried work, and one per job type of kind job.
type Analytics struct {
	Since time.Time `json:"since"`
	Until time.Time `json:"until"`
	// CompleteFrom is from when the figures are complete: retention
	// (`retryd maintenance`) may have removed older rows of retries,
	// retry_history or jobs (retention_marks; the latest cutoff of the
	// three). Nil until a retention run recorded one. Partial says the
	// period starts before it: its older part counts only what is kept.
	CompleteFrom *time.Time `json:"complete_from,omitempty"`
	Partial      bool       `json:"partial,omitempty"`
	// Kinds covers every kind the scheduler retries (job, event,
	// event-trigger, custom kinds), from the retries and retry_history
	// tables, most retried items first.
	Kinds []KindAnalytics `json:"kinds"`
	// JobTypes has the figures of the jobs projection (kind job only):
	// empty when Kind names another kind.
	JobTypes []TypeAnalytics `json:"job_types"`
}

// KindAnalytics are the figures of one kind. An item counts once it has
// failed (that is when the scheduler gets a row for it), so these are the
// items that needed a retry decision, not every item of the kind.
type KindAnalytics struct {
	Kind string `json:"kind"`
	// Items counts items whose first failure was in the period, by state
	// (scheduled, due, succeeded, exhausted, cancelled) in ByState.
	Items   int64            `json:"items"`
	ByState map[string]int64 `json:"by_state"`
	// Succeeded and Exhausted are the items that reached an outcome;
	// SuccessRate is Succeeded / (Succeeded + Exhausted), null when none
	// did.
	Succeeded   int64    `json:"succeeded"`
	Exhausted   int64    `json:"exhausted"`
	SuccessRate *float64 `json:"success_rate"`
	// TotalRetries sums the retries the items used; RetriedItems counts
	// those that used at least one.
	TotalRetries int64 `json:"total_retries"`
	RetriedItems int64 `json:"retried_items"`
	// ErrorsByClass counts failed attempts of the kind in the period by
	// class, most frequent first.
	ErrorsByClass []ClassCount `json:"errors_by_class"`
}

// TypeAnalytics are the figures of one job type.
type TypeAnalytics struct {
	JobType string `json:"job_type"`
	// TotalJobs counts jobs created in the period, by status in ByStatus.
	TotalJobs int64            `json:"total_jobs"`
	ByStatus  map[Status]int64 `json:"by_status"`
	// Succeeded is the completed jobs; Failed the failed and
	// failed_max_retries ones.
	Succeeded int64 `json:"succeeded"`
	Failed    int64 `json:"failed"`
	// SuccessRate is Succeeded / (Succeeded + Failed): the share of jobs
	// that reached an outcome and worked. Null when none did.
	SuccessRate *float64 `json:"success_rate"`
	// AvgAttemptsToSuccess is the mean attempt number of completed jobs
	// (1 = worked the first time).
	AvgAttemptsToSuccess *float64 `json:"avg_attempts_to_success"`
	// TimeToSuccessMS are percentiles (continuous, interpolated) of the
	// time from creation to completion of completed jobs.
	TimeToSuccessMS Percentiles `json:"time_to_success_ms"`
	// TotalRetries sums the retries the jobs used; RetriedJobs counts jobs
	// that used at least one, RetriedSucceeded those of them that
	// completed, and RetrySuccessRate is RetriedSucceeded over the retried
	// jobs that reached an outcome.
	TotalRetries     int64    `json:"total_retries"`
	RetriedJobs      int64    `json:"retried_jobs"`
	RetriedSucceeded int64    `json:"retried_succeeded"`
	RetrySuccessRate *float64 `json:"retry_success_rate"`
	// RetryDistribution counts jobs by the number of retries they used,
	// ascending.
	RetryDistribution []RetryBucket `json:"retry_distribution"`
	// ErrorsByClass counts failed attempts in the period by class, most
	// frequent first.
	ErrorsByClass []ClassCount `json:"errors_by_class"`
	// TopErrors are the most frequent normalized error messages of failed
	// attempts in the period (retryd_normalize_error), with the class most
	// of them had.
	TopErrors []ErrorPattern `json:"top_errors"`
}

// Percentiles of a distribution; null when it is empty.
type Percentiles struct {
	P50 *float64 `json:"p50"`
	P90 *float64 `json:"p90"`
	P99 *float64 `json:"p99"`
}

// RetryBucket is the number of jobs that used Retries retries.
type RetryBucket struct {
	Retries int   `json:"retries"`
	Jobs    int64 `json:"jobs"`
}

// ClassCount is the number of failed attempts of one class.
type ClassCount struct {
	Class string `json:"class"`
	Count int64  `json:"count"`
}

// ErrorPattern is a normalized error message and how often it occurred.
type ErrorPattern struct {
	Pattern string `json:"pattern"`
	Class   string `json:"class"`
	Count   int64  `json:"count"`
}

// RetryAnalytics computes the analytics of q.Since to q.Until: per kind
// from the retries table (items) and retry_history (failed attempts), per
// job type from the jobs table (job outcomes) and retry_history (failed
// attempts of kind job).
func RetryAnalytics(ctx context.Context, db Querier, q AnalyticsQuery) (Analytics, error) {
	if !q.Until.After(q.Since) {
		return Analytics{}, fmt.Errorf("retry analytics: until %s must be after since %s", q.Until, q.Since)
	}
	if q.TopErrors == 0 {
		q.TopErrors = DefaultTopErrors
	}
	out := Analytics{Since: q.Since.UTC(), Until: q.Until.UTC()}
	var from *time.Time
	if err := db.QueryRow(ctx, `SELECT max(cutoff) FROM retention_marks WHERE table_name IN ('retries', 'retry_history', 'jobs')`).Scan(&from); err != nil {
		return Analytics{}, fmt.Errorf("retry analytics: read retention marks: %w", err)
	}
	if from != nil {
		utc := from.UTC()
		out.CompleteFrom, out.Partial = &utc, out.Since.Before(utc)
	}
	types := map[string]*TypeAnalytics{}
	get := func(jobType string) *TypeAnalytics {
		t, ok := types[jobType]
		if !ok {
			t = &TypeAnalytics{
				JobType: jobType, ByStatus: map[Status]int64{},
				RetryDistribution: []RetryBucket{}, ErrorsByClass: []ClassCount{}, TopErrors: []ErrorPattern{},
			}
			types[jobType] = t
		}
		return t
	}
	var err error
	if out.Kinds, err = kindFigures(ctx, db, q); err != nil {
		return Analytics{}, err
	}
	if q.Kind == "" || q.Kind == "job" {
		if err := jobFigures(ctx, db, q, get); err != nil {
			return Analytics{}, err
		}
		if err := retryDistribution(ctx, db, q, get); err != nil {
			return Analytics{}, err
		}
		if err := errorFigures(ctx, db, q, get); err != nil {
			return Analytics{}, err
		}
	}
	out.JobTypes = make([]TypeAnalytics, 0, len(types))
	for _, t := range types {
		out.JobTypes = append(out.JobTypes, *t)
	}
	sort.Slice(out.JobTypes, func(i, j int) bool { return out.JobTypes[i].JobType < out.JobTypes[j].JobType })
	return out, nil
}

func ratio(num, den int64) *float64 {
	if den == 0 {
		return nil
	}
	v := float64(num) / float64(den)
	return &v
}

// kindFigures reads the figures of each kind (of q.Kind only, when set).
func kindFigures(ctx context.Context, db Querier, q AnalyticsQuery) ([]KindAnalytics, error) {
	kinds := map[string]*KindAnalytics{}
	get := func(kind string) *KindAnalytics {
		k, ok := kinds[kind]
		if !ok {
			k = &KindAnalytics{Kind: kind, ByState: map[string]int64{}, ErrorsByClass: []ClassCount{}}
			kinds[kind] = k
		}
		return k
	}
	rows, err := db.Query(ctx, `
SELECT kind, state, count(*), sum(retry_count), count(*) FILTER (WHERE retry_count > 0) FROM retries
WHERE created_at >= $1 AND created_at < $2 AND ($3 = '' OR job_type = $3) AND ($4 = '' OR kind = $4)
GROUP BY kind, state`, q.Since, q.Until, q.JobType, q.Kind)
	if err != nil {
		return nil, fmt.Errorf("retry analytics: kind figures: %w", err)
	}
	var kind, state string
	var n, retries, retried int64
	if _, err := pgx.ForEachRow(rows, []any{&kind, &state, &n, &retries, &retried}, func() error {
		k := get(kind)
		k.ByState[state] = n
		k.Items += n
		k.TotalRetries += retries
		k.RetriedItems += retried
		switch state {
		case "succeeded":
			k.Succeeded = n
		case "exhausted":
			k.Exhausted = n
		}
		return nil
	}); err != nil {
		return nil, fmt.Errorf("retry analytics: kind figures: %w", err)
	}

	rows, err = db.Query(ctx, `
SELECT kind, error_class, count(*) FROM retry_history
WHERE event = 'failed' AND at >= $1 AND at < $2 AND ($3 = '' OR job_type = $3) AND ($4 = '' OR kind = $4)
GROUP BY kind, error_class ORDER BY kind, count(*) DESC, error_class`, q.Since, q.Until, q.JobType, q.Kind)
	if err != nil {
		return nil, fmt.Errorf("retry analytics: errors by kind: %w", err)
	}
	var c ClassCount
	if _, err := pgx.ForEachRow(rows, []any{&kind, &c.Class, &c.Count}, func() error {
		k := get(kind)
		k.ErrorsByClass = append(k.ErrorsByClass, c)
		return nil
	}); err != nil {
		return nil, fmt.Errorf("retry analytics: errors by kind: %w", err)
	}

	out := make([]KindAnalytics, 0, len(kinds))
	for _, k := range kinds {
		k.SuccessRate = ratio(k.Succeeded, k.Succeeded+k.Exhausted)
		out = append(out, *k)
	}
	sort.Slice(out, func(i, j int) bool {
		if out[i].Items != out[j].Items {
			return out[i].Items > out[j].Items
		}
		return out[i].Kind < out[j].Kind
	})
	return out, nil
}

func jobFigures(ctx context.Context, db Querier, q AnalyticsQuery, get func(string) *TypeAnalytics) error {
	rows, err := db.Query(ctx, `
SELECT job_type,
	count(*) FILTER (WHERE status = 'in_progress'),
	count(*) FILTER (WHERE status = 'retrying'),
	count(*) FILTER (WHERE status = 'completed'),
	count(*) FILTER (WHERE status = 'failed'),
	count(*) FILTER (WHERE status = 'failed_max_retries'),
	count(*) FILTER (WHERE status = 'cancelled'),
	sum(retry_count),
	count(*) FILTER (WHERE retry_count > 0),
	count(*) FILTER (WHERE retry_count > 0 AND status = 'completed'),
	count(*) FILTER (WHERE retry_count > 0 AND status IN ('completed', 'failed', 'failed_max_retries')),
	(avg(attempt) FILTER (WHERE status = 'completed'))::float8,
	percentile_cont(ARRAY[0.5, 0.9, 0.99]) WITHIN GROUP (ORDER BY extract(epoch FROM completed_at - created_at) * 1000)
		FILTER (WHERE status = 'completed' AND completed_at IS NOT NULL)
FROM jobs
WHERE created_at >= $1 AND created_at < $2 AND ($3 = '' OR job_type = $3)
GROUP BY job_type`, q.Since, q.Until, q.JobType)
	if err != nil {
		return fmt.Errorf("retry analytics: job figures: %w", err)
	}
	defer rows.Close()
	for rows.Next() {
		var jobType string
		var inProgress, retrying, completed, failed, failedMax, cancelled, retries, retried, retriedOK, retriedDone int64
		var avgAttempts *float64
		var pct []*float64
		if err := rows.Scan(&jobType, &inProgress, &retrying, &completed, &failed, &failedMax, &cancelled,
			&retries, &retried, &retriedOK, &retriedDone, &avgAttempts, &pct); err != nil {
			return fmt.Errorf("retry analytics: job figures: %w", err)
		}
		t := get(jobType)
		for st, n := range map[Status]int64{
			StatusInProgress: inProgress, StatusRetrying: retrying, StatusCompleted: completed,
			StatusFailed: failed, StatusFailedMaxRetries: failedMax, StatusCancelled: cancelled,
		} {
			if n > 0 {
				t.ByStatus[st] = n
			}
			t.TotalJobs += n
		}
		t.Succeeded = completed
		t.Failed = failed + failedMax
		t.SuccessRate = ratio(t.Succeeded, t.Succeeded+t.Failed)
		t.AvgAttemptsToSuccess = avgAttempts
		if len(pct) == 3 {
			t.TimeToSuccessMS = Percentiles{P50: pct[0], P90: pct[1], P99: pct[2]}
		}
		t.TotalRetries, t.RetriedJobs, t.RetriedSucceeded = retries, retried, retriedOK
		t.RetrySuccessRate = ratio(retriedOK, retriedDone)
	}
	if err := rows.Err(); err != nil {
		return fmt.Errorf("retry analytics: job figures: %w", err)
	}
	return nil
}

func retryDistribution(ctx context.Context, db Querier, q AnalyticsQuery, get func(string) *TypeAnalytics) error {
	rows, err := db.Query(ctx, `
SELECT job_type, retry_count, count(*) FROM jobs
WHERE created_at >= $1 AND created_at < $2 AND ($3 = '' OR job_type = $3)
GROUP BY job_type, retry_count ORDER BY job_type, retry_count`, q.Since, q.Until, q.JobType)
	if err != nil {
		return fmt.Errorf("retry analytics: retry distribution: %w", err)
	}
	var jobType string
	var b RetryBucket
	if _, err := pgx.ForEachRow(rows, []any{&jobType, &b.Retries, &b.Jobs}, func() error {
		t := get(jobType)
		t.RetryDistribution = append(t.RetryDistribution, b)
		return nil
	}); err != nil {
		return fmt.Errorf("retry analytics: retry distribution: %w", err)
	}
	return nil
}

// errorFigures reads failed attempts from retry_history: counts by class
// and the top normalized messages per job type.
func errorFigures(ctx context.Context, db Querier, q AnalyticsQuery, get func(string) *TypeAnalytics) error {
	rows, err := db.Query(ctx, `
SELECT job_type, error_class, count(*) FROM retry_history
WHERE kind = 'job' AND event = 'failed' AND job_type <> '' AND at >= $1 AND at < $2 AND ($3 = '' OR job_type = $3)
GROUP BY job_type, error_class ORDER BY job_type, count(*) DESC, error_class`, q.Since, q.Until, q.JobType)
	if err != nil {
		return fmt.Errorf("retry analytics: errors by class: %w", err)
	}
	var jobType string
	var c ClassCount
	if _, err := pgx.ForEachRow(rows, []any{&jobType, &c.Class, &c.Count}, func() error {
		t := get(jobType)
		t.ErrorsByClass = append(t.ErrorsByClass, c)
		return nil
	}); err != nil {
		return fmt.Errorf("retry analytics: errors by class: %w", err)
	}

	rows, err = db.Query(ctx, `
SELECT job_type, pattern, class, n FROM (
	SELECT job_type, retryd_normalize_error(error_message) AS pattern,
		mode() WITHIN GROUP (ORDER BY error_class) AS class, count(*) AS n,
		row_number() OVER (PARTITION BY job_type ORDER BY count(*) DESC, retryd_normalize_error(error_message)) AS rn
	FROM retry_history
	WHERE kind = 'job' AND event = 'failed' AND job_type <> '' AND at >= $1 AND at < $2 AND ($3 = '' OR job_type = $3)
	GROUP BY job_type, retryd_normalize_error(error_message)
) AS p
WHERE rn <= $4
ORDER BY job_type, n DESC, pattern`, q.Since, q.Until, q.JobType, q.TopErrors)
	if err != nil {
		return fmt.Errorf("retry analytics: top errors: %w", err)
	}
	var e ErrorPattern
	if _, err := pgx.ForEachRow(rows, []any{&jobType, &e.Pattern, &e.Class, &e.Count}, func() error {
		t := get(jobType)
		t.TopErrors = append(t.TopErrors, e)
		return nil
	}); err != nil {
		return fmt.Errorf("retry analytics: top errors: %w", err)
	}
	return nil
}
