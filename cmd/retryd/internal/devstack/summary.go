package devstack

import (
	"context"
	"fmt"

	"github.com/retryd/retryd/pkg/dashboard"
)

// Summary counts the retries by kind and state, for the dashboard's
// header and the dev runner's status line.
func (s *Stack) Summary(ctx context.Context) (dashboard.Summary, error) {
	rows, err := s.Pool.Query(ctx, `SELECT kind, state, count(*) FROM retries GROUP BY kind, state ORDER BY kind, state`)
	if err != nil {
		return dashboard.Summary{}, fmt.Errorf("count retries: %w", err)
	}
	defer rows.Close()
	sum := dashboard.Summary{Counts: []dashboard.Count{}}
	for rows.Next() {
		var c dashboard.Count
		if err := rows.Scan(&c.Kind, &c.State, &c.Count); err != nil {
			return dashboard.Summary{}, fmt.Errorf("count retries: %w", err)
		}
		sum.Counts = append(sum.Counts, c)
	}
	if err := rows.Err(); err != nil {
		return dashboard.Summary{}, fmt.Errorf("count retries: %w", err)
	}
	return sum, nil
}
