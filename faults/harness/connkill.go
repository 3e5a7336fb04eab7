package harness

import (
	"context"
	"fmt"
	"time"

	"github.com/jackc/pgx/v5/pgxpool"
)

// Connection kill points, as pg_stat_activity shows a service's backend.
const (
	// KillBeforeCommit terminates backends idle inside a transaction: the
	// service has written but not committed.
	KillBeforeCommit = "before"
	// KillDuringCommit terminates backends running COMMIT: the commit may
	// or may not have reached the WAL when the client loses the answer.
	KillDuringCommit = "during"
	// KillAfterCommit terminates backends whose last statement was a
	// COMMIT that returned: the next statement of the service fails.
	KillAfterCommit = "after"
)

var killWhere = map[string]string{
	KillBeforeCommit: `state = 'idle in transaction'`,
	KillDuringCommit: `state = 'active' AND query ILIKE 'commit%'`,
	KillAfterCommit:  `state = 'idle' AND query ILIKE 'commit%'`,
}

// KillConnections terminates, every interval for d, the service backends
// of pool's database at the given point (KillBeforeCommit, ...), sparing
// the suite's own connections (application_name faults). It returns how
// many backends it terminated.
func KillConnections(ctx context.Context, pool *pgxpool.Pool, point string, d, interval time.Duration) (int, error) {
	where, ok := killWhere[point]
	if !ok {
		return 0, fmt.Errorf("unknown kill point %q", point)
	}
	q := `SELECT count(pg_terminate_backend(pid)) FROM pg_stat_activity
WHERE datname = current_database() AND pid <> pg_backend_pid() AND backend_type = 'client backend'
  AND application_name <> 'faults' AND ` + where
	total := 0
	end := time.Now().Add(d)
	for time.Now().Before(end) {
		var n int
		if err := pool.QueryRow(ctx, q).Scan(&n); err == nil {
			total += n
		}
		select {
		case <-ctx.Done():
			return total, ctx.Err()
		case <-time.After(interval):
		}
	}
	return total, nil
}
