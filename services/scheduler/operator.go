package scheduler

import (
	"context"
	"errors"
	"fmt"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgxpool"

	"github.com/retryd/retryd/internal/dashboard"
	"github.com/retryd/retryd/pkg/contract"
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

// ShardedRetryController is the RetryController of the jobs API when
// RETRIES is split into shards: each action goes to the scheduler of the
// item's shard, Shards[contract.Shard(kind, id, len(Shards))]. The home
// shard's process holds one Scheduler per other shard, built on that
// shard's database and never started: an action on it is what another
// instance of that shard would do (row lock, outbox, published at once;
// that shard's relay publishes whatever it could not).
//
// During a resharding an item may still sit on its shard under an earlier
// count (docs/shards.md): on ErrNotFound the shard under each smaller
// count that divides len(Shards) is tried, largest first, as the gateway
// does for the operator API.
type ShardedRetryController struct{ Shards []*Scheduler }

// RetryNow schedules a new attempt of kind/id now on its shard.
func (c ShardedRetryController) RetryNow(ctx context.Context, kind, id, reason, by string, reset bool, errorClass string) error {
	return c.onShard(kind, id, func(s *Scheduler) error {
		return RetryController{S: s}.RetryNow(ctx, kind, id, reason, by, reset, errorClass)
	})
}

// Cancel cancels the pending retry of kind/id on its shard.
func (c ShardedRetryController) Cancel(ctx context.Context, kind, id, by, reason string) error {
	return c.onShard(kind, id, func(s *Scheduler) error {
		return RetryController{S: s}.Cancel(ctx, kind, id, by, reason)
	})
}

func (c ShardedRetryController) onShard(kind, id string, act func(*Scheduler) error) error {
	var err error
	for _, k := range contract.ShardsOf(kind, id, len(c.Shards)) {
		if err = act(c.Shards[k]); !errors.Is(err, ErrNotFound) {
			return err
		}
	}
	return err
}
