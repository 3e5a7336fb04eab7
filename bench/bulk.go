package main

import (
	"context"
	"fmt"
	"math/rand/v2"
	"sort"
	"strconv"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgxpool"
)

// pendingRows describes background retries loaded straight into the
// retries table with COPY: n rows of one kind in state scheduled, due
// evenly over [from, from+span), inserted in random order (as real
// failures arrive) so neither the heap nor the index is in due order.
//
// Going through the failed path would take the scheduler about as long as
// the cycle rate says (a million rows at a few thousand a second is many
// minutes); what the lateness, burst and recovery scenarios measure is
// how the scheduler copes with rows already pending, and the rows are the
// ones it would have written: attempt 2 scheduled after attempt 1 failed
// with a temporary error, a small JSON payload, no history rows.
type pendingRows struct {
	kind string
	n    int
	from time.Time
	span time.Duration
	// keep, when set, copies only the slots whose id it keeps: the rows
	// of one scheduler shard's database (the shards scenario).
	keep func(id string) bool
}

// backgroundStart is when background rows loaded now should start coming
// due: after the COPY (about 20 µs a row here, with margin) and a
// scheduler start, so no row is already late when the scheduler first
// sees it (that would measure the load, not the scheduler).
func backgroundStart(n int) time.Time {
	return time.Now().Add(5*time.Second + time.Duration(n)*20*time.Microsecond)
}

// dueAt is when slot i comes due.
func (p pendingRows) dueAt(i int) time.Time {
	return p.from.Add(time.Duration(float64(p.span) * (float64(i) + 0.5) / float64(p.n)))
}

func (p pendingRows) id(i int) string { return p.kind + "-" + strconv.Itoa(i) }

// dueBy is how many slots come due at or before t.
func (p pendingRows) dueBy(t time.Time) int {
	// Searching with dueAt itself keeps the two consistent to the
	// nanosecond, whatever the float rounding.
	return sort.Search(p.n, func(i int) bool { return p.dueAt(i).After(t) })
}

var pendingColumns = []string{
	"kind", "item_id", "state", "attempt", "retry_count", "max_retries", "policy_name", "policy_version",
	"next_attempt_at", "last_error_class", "last_error_message", "last_error_at", "last_reason", "payload",
}

func copyPending(ctx context.Context, pool *pgxpool.Pool, p pendingRows) error {
	if p.n == 0 {
		return nil
	}
	order := rand.Perm(p.n)
	if p.keep != nil {
		kept := order[:0]
		for _, slot := range order {
			if p.keep(p.id(slot)) {
				kept = append(kept, slot)
			}
		}
		order = kept
	}
	now := time.Now()
	i := 0
	src := pgx.CopyFromFunc(func() ([]any, error) {
		if i >= len(order) {
			return nil, nil
		}
		slot := order[i]
		i++
		payload := `{"event_id":"` + p.id(slot) + `","source":"billing","type":"invoice.paid","amount_cents":12950}`
		return []any{
			p.kind, p.id(slot), "scheduled", 2, 1, 3, "bench-background", 1,
			p.dueAt(slot), "temporary", "upstream unavailable", now, "backoff", payload,
		}, nil
	})
	n, err := pool.CopyFrom(ctx, pgx.Identifier{"retries"}, pendingColumns, src)
	if err != nil {
		return fmt.Errorf("copy %d pending retries: %w", p.n, err)
	}
	if int(n) != len(order) {
		return fmt.Errorf("copy pending retries: copied %d rows, want %d", n, len(order))
	}
	if _, err := pool.Exec(ctx, "ANALYZE retries"); err != nil {
		return fmt.Errorf("analyze retries: %w", err)
	}
	return nil
}

// historyRows bulk-loads retry_history up to total rows with
// generate_series, in batches so one statement never holds a 10M-row
// transaction: the shape is that of real histories (failed, scheduled,
// due, succeeded for items of several kinds, spread over 30 days).
func loadHistory(ctx context.Context, pool *pgxpool.Pool, from, to int64) error {
	return insertHistory(ctx, pool, from, to, `now() - make_interval(secs => (g % 2592000))`)
}

// loadHistorySpan loads the rows from..to of the same shape with their
// times spread over [start, start+span) instead of the last 30 days (the
// retention scenario fills chosen day partitions).
func loadHistorySpan(ctx context.Context, pool *pgxpool.Pool, from, to int64, start time.Time, span time.Duration) error {
	secs := max(int64(span/time.Second), 1)
	return insertHistory(ctx, pool, from, to, fmt.Sprintf(`'%s'::timestamptz + make_interval(secs => (g %% %d))`,
		start.UTC().Format(time.RFC3339), secs))
}

// insertHistory inserts the rows from..to (the g of generate_series) with
// at (and next_attempt_at of the scheduled entries) given by the SQL
// expression at over g.
func insertHistory(ctx context.Context, pool *pgxpool.Pool, from, to int64, at string) error {
	const batch = 1_000_000
	for lo := from; lo < to; lo += batch {
		hi := min(lo+batch, to)
		_, err := pool.Exec(ctx, `
INSERT INTO retry_history (kind, item_id, attempt, event, job_type, source, error_class, error_message,
    delay_ms, decided_by, policy_name, policy_version, next_attempt_at, msg_id, at)
SELECT (ARRAY['event','event-trigger','job'])[1 + g % 3],
       'h' || (g / 4)::text,
       1 + (g % 4) / 2,
       (ARRAY['failed','scheduled','due','succeeded'])[1 + g % 4],
       CASE WHEN g % 3 = 2 THEN 'data_enrichment' ELSE '' END,
       'billing',
       CASE WHEN g % 4 = 0 THEN 'temporary' ELSE '' END,
       CASE WHEN g % 4 = 0 THEN 'upstream unavailable' ELSE '' END,
       CASE WHEN g % 4 = 1 THEN 1000 END,
       CASE WHEN g % 4 = 1 THEN 'backoff' ELSE '' END,
       'default', 1,
       CASE WHEN g % 4 = 1 THEN `+at+` END,
       'h:' || g::text,
       `+at+`
FROM generate_series($1::bigint, $2::bigint - 1) AS g`, lo, hi)
		if err != nil {
			return fmt.Errorf("load history rows %d..%d: %w", lo, hi, err)
		}
	}
	return nil
}
