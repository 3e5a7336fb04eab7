package scheduler

import (
	"context"
	"fmt"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgxpool"

	"github.com/retryd/retryd/internal/dashboard"
)

// RetryController adapts the scheduler to the jobs API's RetryController
// (services/jobs), so manual retries and cancels of jobs are the
// scheduler's lifecycle events like any other operator action.
type RetryController struct{ S *Scheduler }

// RetryNow schedules a new attempt of kind/id now, filed under errorClass
// when it is not empty.
func (c RetryController) RetryNow(ctx context.Context, kind, id, reason, by string, reset bool, errorClass string) error {
	_, err := c.S.RetryNow(ctx, kind, id, RetryNowOptions{Reason: reason, By: by, ResetAttempts: reset, ErrorClass: errorClass})
	return err
}

// Cancel cancels the pending retry of kind/id.
func (c RetryController) Cancel(ctx context.Context, kind, id, by, reason string) error {
	_, err := c.S.Cancel(ctx, kind, id, by, reason)
	return err
}

// Summary counts the retries by kind and state for the dashboard's header
// and the dev runner's status line. It needs only SELECT on retries, so the
// runtime role or a read replica will do.
func Summary(ctx context.Context, pool *pgxpool.Pool) (dashboard.Summary, error) {
	rows, err := pool.Query(ctx, `SELECT kind, state, count(*) FROM retries GROUP BY kind, state ORDER BY kind, state`)
	if err != nil {
		return dashboard.Summary{}, fmt.Errorf("count retries: %w", err)
	}
	sum := dashboard.Summary{Counts: []dashboard.Count{}}
	var c dashboard.Count
	if _, err := pgx.ForEachRow(rows, []any{&c.Kind, &c.State, &c.Count}, func() error {
		sum.Counts = append(sum.Counts, c)
		return nil
	}); err != nil {
		return dashboard.Summary{}, fmt.Errorf("count retries: %w", err)
	}
	return sum, nil
}
