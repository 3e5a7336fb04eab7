package faults_test

import (
	"context"
	"fmt"
	"strings"
	"testing"
	"time"

	"github.com/jackc/pgx/v5/pgxpool"

	"github.com/retryd/retryd/faults/harness"
	"github.com/retryd/retryd/migrations/pgtest"
	"github.com/retryd/retryd/pkg/contract"
)

func TestMain(m *testing.M) { pgtest.Main(m) }

// scenarioTimeout bounds one scenario.
func scenarioTimeout() time.Duration {
	if harness.Full() {
		return 30 * time.Minute
	}
	return 3 * time.Minute
}

// setup starts NATS and a fresh migrated database for one scenario; the
// scenario starts the services it needs.
func setup(t *testing.T, opts harness.Options) *harness.System {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), scenarioTimeout())
	t.Cleanup(cancel)
	if opts.DatabaseURL == "" {
		opts.DatabaseURL = pgtest.NewDatabaseURL(t)
	}
	return harness.NewSystem(t, ctx, opts)
}

// states counts the scheduler's retry rows of kind by state.
func states(ctx context.Context, pool *pgxpool.Pool, kind string) map[string]int {
	out := map[string]int{}
	rows, err := pool.Query(ctx, `SELECT state, count(*) FROM retries WHERE kind = $1 GROUP BY state`, kind)
	if err != nil {
		return out
	}
	defer rows.Close()
	for rows.Next() {
		var s string
		var n int
		if rows.Scan(&s, &n) == nil {
			out[s] = n
		}
	}
	return out
}

// fastPolicy is a policy without jitter whose first retry comes after
// delay.
func fastPolicy(name string, delay time.Duration, maxRetries int) map[string]any {
	return map[string]any{
		"name": name, "max_retries": maxRetries, "base_delay_ms": delay.Milliseconds(),
		"max_delay_ms": 4 * delay.Milliseconds(), "multiplier": 2, "jitter": "none",
	}
}

// failedItems builds the first failure of n items of kind.
func failedItems(t *testing.T, kind, prefix string, n int, retryAfter func(i int) *contract.RetryAfter) ([]string, []*natsMsg) {
	t.Helper()
	ids := make([]string, n)
	msgs := make([]*natsMsg, n)
	for i := range n {
		ids[i] = fmt.Sprintf("%s-%06d", prefix, i)
		var ra *contract.RetryAfter
		if retryAfter != nil {
			ra = retryAfter(i)
		}
		m, err := harness.FailedMsg(kind, ids[i], 1, "temporary", ra)
		if err != nil {
			t.Fatalf("build failed event: %v", err)
		}
		msgs[i] = m
	}
	return ids, msgs
}

// dueCheck reads every stored due of kind and compares with the items
// sent: lost are items whose due for attempt 2 never arrived at the
// owner, duplicate effects are dues stored more than once, absorbed the
// due copies deduplication dropped plus the redeliveries the owner saw.
func dueCheck(t *testing.T, s *harness.System, o *harness.Owner, kind string, ids []string, r *harness.Report) {
	t.Helper()
	stored, err := harness.Stored(s.Ctx, s.JS, contract.StreamRetries, contract.RetryFilter(kind, contract.Due))
	if err != nil {
		t.Fatalf("read dues: %v", err)
	}
	counts := harness.CountByMsgID(stored)
	r.Sent = len(ids)
	for _, id := range ids {
		if !o.Has(id, 2) {
			r.Lost++
		}
	}
	ownerDups, redeliveries := o.Tally()
	r.DuplicateEffects = max(harness.Duplicates(counts), ownerDups)
	r.Absorbed = s.Wire.Extra(counts, func(id string) bool { return strings.HasPrefix(id, kind+"-retry:") }) + redeliveries
	r.Note("dues stored %d for %d items; owner redeliveries %d", len(stored), len(ids), redeliveries)
}
