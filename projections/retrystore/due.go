package retrystore

import (
	"context"
	"fmt"
	"time"
)

// DueRow is a row selected for a due emission and how late it is by the
// database clock at selection time.
type DueRow struct {
	Retry
	Lateness time.Duration
}

// SelectDue locks up to limit scheduled rows whose next_attempt_at has
// passed by the database clock, earliest first. Rows locked by another
// transaction (another scheduler instance) are skipped, so instances share
// the work without waiting on each other. q must be a transaction.
func SelectDue(ctx context.Context, q Querier, limit int) ([]DueRow, error) {
	return selectDue(ctx, q, `SELECT `+retryColumns+`, extract(epoch FROM clock_timestamp() - next_attempt_at)
FROM retries
WHERE state = 'scheduled' AND next_attempt_at <= now()
ORDER BY next_attempt_at
LIMIT $1
FOR UPDATE SKIP LOCKED`, limit)
}

// SelectRedue locks up to limit due rows whose due event went out more
// than after ago (by the database clock) without an outcome from the
// owner, oldest first, skipping rows locked elsewhere. q must be a
// transaction.
func SelectRedue(ctx context.Context, q Querier, after time.Duration, limit int) ([]DueRow, error) {
	return selectDue(ctx, q, `SELECT `+retryColumns+`, extract(epoch FROM clock_timestamp() - next_attempt_at)
FROM retries
WHERE state = 'due' AND due_at <= now() - make_interval(secs => $2)
ORDER BY due_at
LIMIT $1
FOR UPDATE SKIP LOCKED`, limit, after.Seconds())
}

func selectDue(ctx context.Context, q Querier, sql string, args ...any) ([]DueRow, error) {
	rows, err := q.Query(ctx, sql, args...)
	if err != nil {
		return nil, fmt.Errorf("select due retries: %w", err)
	}
	defer rows.Close()
	var out []DueRow
	for rows.Next() {
		var late float64
		r, err := scanRetry(rows, &late)
		if err != nil {
			return nil, fmt.Errorf("select due retries: %w", err)
		}
		out = append(out, DueRow{Retry: r, Lateness: time.Duration(late * float64(time.Second))})
	}
	if err := rows.Err(); err != nil {
		return nil, fmt.Errorf("select due retries: %w", err)
	}
	return out, nil
}

// MarkDue records that the due events of keys were published: state due,
// due_at now(), one more emission. The caller adds the history rows.
func MarkDue(ctx context.Context, q Querier, keys []Key) error {
	if len(keys) == 0 {
		return nil
	}
	kinds := make([]string, len(keys))
	items := make([]string, len(keys))
	for i, k := range keys {
		kinds[i], items[i] = k.Kind, k.ItemID
	}
	tag, err := q.Exec(ctx, `
UPDATE retries r SET state = 'due', due_at = now(), due_emissions = r.due_emissions + 1, updated_at = now()
FROM unnest($1::text[], $2::text[]) AS k(kind, item_id)
WHERE r.kind = k.kind AND r.item_id = k.item_id`, kinds, items)
	if err != nil {
		return fmt.Errorf("mark retries due: %w", err)
	}
	if int(tag.RowsAffected()) != len(keys) {
		return fmt.Errorf("mark retries due: updated %d rows, want %d", tag.RowsAffected(), len(keys))
	}
	return nil
}

// NextDue returns the earliest next_attempt_at of the scheduled rows
// (ok is false when nothing is scheduled) and the database clock, so the
// caller can sleep for next minus dbNow without trusting its own clock. It
// reads one entry of the partial index retries_due_idx.
func NextDue(ctx context.Context, q Querier) (next time.Time, ok bool, dbNow time.Time, err error) {
	var n *time.Time
	err = q.QueryRow(ctx, `SELECT (SELECT min(next_attempt_at) FROM retries WHERE state = 'scheduled'), clock_timestamp()`).Scan(&n, &dbNow)
	if err != nil {
		return time.Time{}, false, time.Time{}, fmt.Errorf("read next due time: %w", err)
	}
	if n == nil {
		return time.Time{}, false, dbNow, nil
	}
	return *n, true, dbNow, nil
}

// NextRedue returns how long until the oldest due row becomes eligible for
// a re-emission after the given timeout; ok is false when no row is due.
func NextRedue(ctx context.Context, q Querier, after time.Duration) (in time.Duration, ok bool, err error) {
	var secs float64
	err = q.QueryRow(ctx, `SELECT extract(epoch FROM due_at + make_interval(secs => $1) - clock_timestamp())
FROM retries WHERE state = 'due' ORDER BY due_at LIMIT 1`, after.Seconds()).Scan(&secs)
	if err != nil {
		if isNoRows(err) {
			return 0, false, nil
		}
		return 0, false, fmt.Errorf("read next redue time: %w", err)
	}
	return time.Duration(secs * float64(time.Second)), true, nil
}
