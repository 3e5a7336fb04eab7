package retrystore

import (
	"context"
	"fmt"
	"slices"
	"strings"
	"time"
)

// DueRow is a row claimed for a due emission: as it is after the claim
// (state due, one more emission), how late it was by the database clock,
// and what the claim replaced so ReleaseDue can put it back.
type DueRow struct {
	Retry
	Lateness time.Duration
	// PrevState and PrevDueAt are the row's state and due_at before the
	// claim: scheduled for a first emission, due for a re-emission.
	PrevState State
	PrevDueAt *time.Time
}

// ClaimDue locks up to limit scheduled rows whose next_attempt_at has
// passed by the database clock, earliest first, and marks them due in the
// same statement: state due, due_at now(), one more emission. Rows locked
// by another transaction (another scheduler instance) are skipped, so
// instances share the work without waiting on each other. q must be a
// transaction: the caller publishes the due events, releases the rows it
// could not publish with ReleaseDue and commits, so a crash before the
// commit leaves every row scheduled.
//
// Range narrows the claim to rows with From <= next_attempt_at < Until
// (a zero bound is no bound). While a backlog drains, the caller hands
// each batch its own range (see DueBound), so concurrent claims neither
// step over the rows the others hold nor wait on each other. The caller
// must claim without a range before it considers the backlog drained:
// rows behind a range it has passed (released, or locked by another
// instance at the time) are found only then.
//
// Claiming and marking in one statement finds each row once, by its
// physical address while the statement holds its lock, instead of a select
// followed by an update that looks every row up again by key.
func ClaimDue(ctx context.Context, q Querier, limit int, r Range) ([]DueRow, error) {
	cond, args := "", []any{limit}
	if !r.From.IsZero() {
		args = append(args, r.From)
		cond += fmt.Sprintf(" AND next_attempt_at >= $%d", len(args))
	}
	if !r.Until.IsZero() {
		args = append(args, r.Until)
		cond += fmt.Sprintf(" AND next_attempt_at < $%d", len(args))
	}
	return claim(ctx, q, byNextAttempt, `
WITH picked AS (
	SELECT ctid, state, due_at FROM retries
	WHERE state = 'scheduled' AND next_attempt_at <= now()`+cond+`
	ORDER BY next_attempt_at
	LIMIT $1
	FOR UPDATE SKIP LOCKED
)`, args...)
}

// Range is a span of next_attempt_at: From inclusive, Until exclusive.
type Range struct{ From, Until time.Time }

// DueBound returns the next_attempt_at of the due scheduled row that
// follows the first n at or after from (ok is false when there are not
// that many): [from, bound) then holds at most n rows, the claim of one
// batch. It locks nothing and reads only the due index's range.
func DueBound(ctx context.Context, q Querier, from time.Time, n int) (bound time.Time, ok bool, err error) {
	err = q.QueryRow(ctx, `SELECT next_attempt_at FROM retries
WHERE state = 'scheduled' AND next_attempt_at <= now() AND next_attempt_at >= $1
ORDER BY next_attempt_at OFFSET $2 LIMIT 1`, from, n).Scan(&bound)
	if err != nil {
		if isNoRows(err) {
			return time.Time{}, false, nil
		}
		return time.Time{}, false, fmt.Errorf("read due bound: %w", err)
	}
	return bound, true, nil
}

// ClaimRedue is ClaimDue for due rows whose due event went out more than
// after ago (by the database clock) without an outcome from the owner,
// oldest first.
func ClaimRedue(ctx context.Context, q Querier, after time.Duration, limit int) ([]DueRow, error) {
	return claim(ctx, q, byPrevDueAt, `
WITH picked AS (
	SELECT ctid, state, due_at FROM retries
	WHERE state = 'due' AND due_at <= now() - make_interval(secs => $2)
	ORDER BY due_at
	LIMIT $1
	FOR UPDATE SKIP LOCKED
)`, limit, after.Seconds())
}

// claim runs the claiming statement: picked is a CTE naming the rows (by
// ctid) with their state and due_at before the claim.
func claim(ctx context.Context, q Querier, order func(a, b DueRow) int, picked string, args ...any) ([]DueRow, error) {
	rows, err := q.Query(ctx, picked+`
UPDATE retries r SET state = 'due', due_at = now(), due_emissions = r.due_emissions + 1, updated_at = now()
FROM picked
WHERE r.ctid = picked.ctid
RETURNING `+claimedColumns+`, extract(epoch FROM clock_timestamp() - r.next_attempt_at), picked.state, picked.due_at`, args...)
	if err != nil {
		return nil, fmt.Errorf("claim due retries: %w", err)
	}
	defer rows.Close()
	var out []DueRow
	for rows.Next() {
		var late float64
		var d DueRow
		var prev string
		d.Retry, err = scanRetry(rows, &late, &prev, &d.PrevDueAt)
		if err != nil {
			return nil, fmt.Errorf("claim due retries: %w", err)
		}
		d.Lateness = time.Duration(late * float64(time.Second))
		d.PrevState = State(prev)
		out = append(out, d)
	}
	if err := rows.Err(); err != nil {
		return nil, fmt.Errorf("claim due retries: %w", err)
	}
	// RETURNING follows the update's join order, not the claim's.
	slices.SortFunc(out, order)
	return out, nil
}

// claimedColumns are retryColumns qualified by the updated table's alias:
// the claim's CTE has columns of the same names.
var claimedColumns = func() string {
	cols := strings.Split(retryColumns, ",")
	for i, c := range cols {
		cols[i] = "r." + strings.TrimSpace(c)
	}
	return strings.Join(cols, ", ")
}()

func byNextAttempt(a, b DueRow) int { return compareTimes(a.NextAttemptAt, b.NextAttemptAt) }
func byPrevDueAt(a, b DueRow) int   { return compareTimes(a.PrevDueAt, b.PrevDueAt) }

func compareTimes(a, b *time.Time) int {
	switch {
	case a == nil && b == nil:
		return 0
	case a == nil:
		return -1
	case b == nil:
		return 1
	}
	return a.Compare(*b)
}

// ReleaseDue undoes the claim of rows whose due event was not published:
// each gets its previous state and due_at back and one emission less, so
// the next pass picks it up again. q must be the claiming transaction.
func ReleaseDue(ctx context.Context, q Querier, rows []DueRow) error {
	if len(rows) == 0 {
		return nil
	}
	kinds, items, states, dueAts := undoColumns(rows)
	tag, err := q.Exec(ctx, `
UPDATE retries r SET state = k.state, due_at = k.due_at, due_emissions = r.due_emissions - 1
FROM unnest($1::text[], $2::text[], $3::text[], $4::timestamptz[]) AS k(kind, item_id, state, due_at)
WHERE r.kind = k.kind AND r.item_id = k.item_id AND r.state = 'due'`, kinds, items, states, dueAts)
	if err != nil {
		return fmt.Errorf("release due retries: %w", err)
	}
	if int(tag.RowsAffected()) != len(rows) {
		return fmt.Errorf("release due retries: updated %d rows, want %d", tag.RowsAffected(), len(rows))
	}
	return nil
}

// undoColumns returns the key and the pre-claim state and due_at of rows,
// as arrays for unnest.
func undoColumns(rows []DueRow) (kinds, items, states []string, dueAts []*time.Time) {
	kinds, items = make([]string, len(rows)), make([]string, len(rows))
	states, dueAts = make([]string, len(rows)), make([]*time.Time, len(rows))
	for i, r := range rows {
		kinds[i], items[i], states[i], dueAts[i] = r.Kind, r.ItemID, string(r.PrevState), r.PrevDueAt
	}
	return kinds, items, states, dueAts
}

// ParkDue undoes the claim of rows whose due event can never be built (it
// would be larger than any stream accepts) and sets them aside for after:
// a scheduled row gets next_attempt_at now() + after, a re-emission gets
// due_at now(). reasons[i] goes to the last_reason of rows[i], where an
// operator sees why the retry has not come due and can cancel it. Without
// this one such row would be claimed again by every pass. q must be the
// claiming transaction.
func ParkDue(ctx context.Context, q Querier, rows []DueRow, after time.Duration, reasons []string) error {
	if len(rows) == 0 {
		return nil
	}
	kinds, items, states, dueAts := undoColumns(rows)
	tag, err := q.Exec(ctx, `
UPDATE retries r SET state = k.state, due_emissions = r.due_emissions - 1, last_reason = k.reason,
	next_attempt_at = CASE WHEN k.state = 'scheduled' THEN now() + make_interval(secs => $5) ELSE r.next_attempt_at END,
	due_at = CASE WHEN k.state = 'scheduled' THEN k.due_at ELSE now() END
FROM unnest($1::text[], $2::text[], $3::text[], $4::timestamptz[], $6::text[]) AS k(kind, item_id, state, due_at, reason)
WHERE r.kind = k.kind AND r.item_id = k.item_id AND r.state = 'due'`, kinds, items, states, dueAts, after.Seconds(), reasons)
	if err != nil {
		return fmt.Errorf("park due retries: %w", err)
	}
	if int(tag.RowsAffected()) != len(rows) {
		return fmt.Errorf("park due retries: updated %d rows, want %d", tag.RowsAffected(), len(rows))
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
