package devstack

import (
	"context"

	"github.com/retryd/retryd/internal/dashboard"
	"github.com/retryd/retryd/services/scheduler"
)

// Summary counts the retries by kind and state, for the dashboard's
// header and the dev runner's status line.
func (s *Stack) Summary(ctx context.Context) (dashboard.Summary, error) {
	return scheduler.Summary(ctx, s.Pool)
}
