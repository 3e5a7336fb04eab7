package devstack

import (
	"context"

	"github.com/retryd/retryd/services/scheduler"
)

// RetryController adapts the scheduler to jobs.RetryController, so the
// jobs API's manual retry and cancel go through the scheduler.
type RetryController struct{ S *scheduler.Scheduler }

// RetryNow schedules a new attempt of kind/id now.
func (c RetryController) RetryNow(ctx context.Context, kind, id, reason, by string, reset bool) error {
	_, err := c.S.RetryNow(ctx, kind, id, scheduler.RetryNowOptions{Reason: reason, By: by, ResetAttempts: reset})
	return err
}

// Cancel cancels the pending retry of kind/id.
func (c RetryController) Cancel(ctx context.Context, kind, id, by, reason string) error {
	_, err := c.S.Cancel(ctx, kind, id, by, reason)
	return err
}
