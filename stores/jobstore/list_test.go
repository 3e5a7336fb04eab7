package jobstore_test

import (
	"encoding/json"
	"fmt"
	"testing"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/stretchr/testify/require"

	"github.com/retryd/retryd/stores/jobstore"
	"github.com/retryd/retryd/stores/pgdb"
)

// seedList inserts 30 jobs: statuses cycle through failed_max_retries,
// failed and completed; retry_count = i % 6; updated_at one minute apart.
func (b *bundle) seedList(t *testing.T) {
	t.Helper()
	statuses := []string{"failed_max_retries", "failed", "completed"}
	for i := range 30 {
		typ := "email_campaign"
		if i%2 == 1 {
			typ = "data_enrichment"
		}
		class := "timeout"
		if i%5 == 0 {
			class = "validation"
		}
		_, err := b.pool.Exec(b.ctx, `INSERT INTO jobs (job_id, job_type, status, retry_count, last_error_class, updated_at)
VALUES ($1, $2, $3, $4, $5, $6)`, fmt.Sprintf("j%02d", i), typ, statuses[i%3], i%6, class, b.t0.Add(time.Duration(i)*time.Minute))
		require.NoError(t, err)
	}
}

func TestListFiltersAndPages(t *testing.T) {
	t.Parallel()
	b := setup(t)
	b.seedList(t)
	f := jobstore.Filter{
		Statuses:      []jobstore.Status{jobstore.StatusFailedMaxRetries, jobstore.StatusFailed},
		JobType:       "email_campaign",
		MinRetryCount: 2,
	}
	// Matches: even i, i%3 != 2, i%6 >= 2: i = 4, 10, 16, 22, 28.
	var ids []string
	cursor := ""
	for range 10 {
		page, err := jobstore.List(b.ctx, b.pool, f, 2, cursor)
		require.NoError(t, err)
		for _, j := range page.Jobs {
			ids = append(ids, j.ID)
		}
		if page.NextCursor == "" {
			break
		}
		cursor = page.NextCursor
	}
	require.Equal(t, []string{"j28", "j22", "j16", "j10", "j04"}, ids)
	n, err := jobstore.Count(b.ctx, b.pool, f)
	require.NoError(t, err)
	require.Equal(t, int64(5), n)

	since, until := b.t0.Add(10*time.Minute), b.t0.Add(20*time.Minute)
	n, err = jobstore.Count(b.ctx, b.pool, jobstore.Filter{ErrorClass: "validation", Since: &since, Until: &until})
	require.NoError(t, err)
	require.Equal(t, int64(2), n) // j10, j15

	all, err := jobstore.List(b.ctx, b.pool, jobstore.Filter{}, 0, "")
	require.NoError(t, err)
	require.Len(t, all.Jobs, 30)
	require.Empty(t, all.NextCursor)

	_, err = jobstore.List(b.ctx, b.pool, f, 2, "garbage")
	require.ErrorIs(t, err, pgdb.ErrBadCursor)
	_, err = jobstore.List(b.ctx, b.pool, f, jobstore.MaxListLimit+1, "")
	require.Error(t, err)
}

func TestBulkRetryOperation(t *testing.T) {
	t.Parallel()
	b := setup(t)
	b.seedList(t)
	f := jobstore.Filter{Statuses: []jobstore.Status{jobstore.StatusFailedMaxRetries}, JobType: "data_enrichment"}
	// Matches: odd i with i%3 == 0: 3, 9, 15, 21, 27.
	tx, err := b.pool.Begin(b.ctx)
	require.NoError(t, err)
	op, err := jobstore.CreateBulkRetry(b.ctx, tx, jobstore.NewBulkRetry{
		ID: "op1", Filter: f, FilterJSON: json.RawMessage(`{"status":"failed_max_retries"}`),
		Reason: "downstream recovered", RequestedBy: "ops", RatePerSecond: 5,
	})
	require.NoError(t, err)
	require.NoError(t, tx.Commit(b.ctx))
	require.Equal(t, jobstore.OperationRunning, op.Status)
	require.Equal(t, 5, op.Total)
	require.Equal(t, 5, op.Pending)

	ids, err := jobstore.LeaseOperations(b.ctx, b.pool, "runner-a", time.Minute)
	require.NoError(t, err)
	require.Equal(t, []string{"op1"}, ids)
	// The lease is held: another runner gets nothing.
	ids, err = jobstore.LeaseOperations(b.ctx, b.pool, "runner-b", time.Minute)
	require.NoError(t, err)
	require.Empty(t, ids)

	var order []string
	results := []string{jobstore.ItemReleased, jobstore.ItemReleased, jobstore.ItemSkipped, jobstore.ItemFailed, jobstore.ItemReleased}
	for i := 0; ; i++ {
		done := false
		require.NoError(t, pgx.BeginFunc(b.ctx, b.pool, func(tx pgx.Tx) error {
			jobID, ok, err := jobstore.NextItem(b.ctx, tx, "op1", "runner-a")
			if err != nil || !ok {
				done = true
				return err
			}
			// A second runner without the lease sees nothing to do.
			_, other, err := jobstore.NextItem(b.ctx, tx, "op1", "runner-b")
			require.NoError(t, err)
			require.False(t, other)
			order = append(order, jobID)
			return jobstore.FinishItem(b.ctx, tx, "op1", jobID, results[i], map[bool]string{true: "refused"}[results[i] == jobstore.ItemFailed])
		}))
		if done {
			break
		}
	}
	require.Equal(t, []string{"j03", "j09", "j15", "j21", "j27"}, order, "oldest change first")
	completed, err := jobstore.CompleteOperation(b.ctx, b.pool, "op1")
	require.NoError(t, err)
	require.True(t, completed)
	op, err = jobstore.GetOperation(b.ctx, b.pool, "op1")
	require.NoError(t, err)
	require.Equal(t, jobstore.OperationCompleted, op.Status)
	require.Equal(t, []int{5, 3, 1, 1, 0}, []int{op.Total, op.Released, op.Skipped, op.Failed, op.Pending})
	require.NotNil(t, op.FinishedAt)
	items, err := jobstore.OperationItems(b.ctx, b.pool, "op1", 10)
	require.NoError(t, err)
	require.Len(t, items, 2)
	require.Equal(t, "j15", items[0].JobID)
	require.Equal(t, "refused", items[1].Error)

	// A filter matching nothing completes at once; cancel stops a running one.
	empty, err := jobstore.CreateBulkRetry(b.ctx, b.pool, jobstore.NewBulkRetry{ID: "op2", Filter: jobstore.Filter{JobType: "nope"}, FilterJSON: json.RawMessage(`{}`), RatePerSecond: 1})
	require.NoError(t, err)
	require.Equal(t, jobstore.OperationCompleted, empty.Status)
	_, err = jobstore.CreateBulkRetry(b.ctx, b.pool, jobstore.NewBulkRetry{ID: "op3", Filter: f, FilterJSON: json.RawMessage(`{}`), RatePerSecond: 1})
	require.NoError(t, err)
	cancelled, err := jobstore.CancelOperation(b.ctx, b.pool, "op3")
	require.NoError(t, err)
	require.Equal(t, jobstore.OperationCancelled, cancelled.Status)
	require.Equal(t, 5, cancelled.Pending)
	ids, err = jobstore.LeaseOperations(b.ctx, b.pool, "runner-b", time.Minute)
	require.NoError(t, err)
	require.Empty(t, ids)
	_, err = jobstore.GetOperation(b.ctx, b.pool, "missing")
	require.ErrorIs(t, err, pgdb.ErrNotFound)
}
