package ingressstore

import (
	"context"
	"errors"
	"fmt"
	"time"

	"github.com/jackc/pgx/v5"

	"github.com/retryd/retryd/pkg/contract"
)

// PaceRelease puts every deferred event of source in the release line,
// in arrival order, for a release (a resume, a limit change) inside tx,
// after the change to the source's row: ingress's releaser admits each
// one itself at its slot (AdmitReleased), and the scheduler, told so by
// the release (owner_admits), emits no due for them. It returns the pace
// the slots follow (nil when the source has no rate limit: every slot is
// now, a microsecond apart) and how many events are in the line; 0 when
// the source is paused with no end (nothing is released).
//
// Under a rate limit each event gets a slot of the limit, so a release of
// 100,000 held events runs at the limit and no window edge wakes them all.
// The line starts at the first slot of the current window not yet passed
// or taken. Events that held slots of the old settings take new ones, in
// the same line. Arrival order is the event's INGEST stream sequence
// (ingest_seq); events stored before that column existed go first, by
// when they were first deferred (the scheduler's held_since). Under a rate limit
// newcomers queue behind the line (see Gate); without one the gate admits
// them at once.
func PaceRelease(ctx context.Context, tx pgx.Tx, source string) (*contract.ReleasePace, int64, error) {
	var now time.Time
	src, err := scanSource(tx.QueryRow(ctx, `SELECT `+sourceColumns+`, now() FROM event_sources s WHERE s.source = $1`, source), &now)
	if errors.Is(err, pgx.ErrNoRows) {
		return nil, 0, nil
	}
	if err != nil {
		return nil, 0, fmt.Errorf("read event source: %w", err)
	}
	if _, err := tx.Exec(ctx, `WITH holds AS (DELETE FROM event_source_holds WHERE source = $1)
		DELETE FROM event_source_slots WHERE source = $1`, source); err != nil {
		return nil, 0, fmt.Errorf("end slot holds: %w", err)
	}
	if src.PausedAt(now) && src.PausedUntil == nil {
		return nil, 0, nil
	}
	// Still paused until a time (the limit changed during the pause): the
	// line starts at the pause's end, where the gate gives slots to the
	// events deferred meanwhile.
	lineAt := now
	if src.PausedAt(now) {
		lineAt = *src.PausedUntil
	}
	if src.RateLimit == nil || src.RateWindow <= 0 {
		n, err := lineUp(ctx, tx, source, lineAt)
		if err != nil {
			return nil, 0, err
		}
		return nil, n, analyzeLine(ctx, tx, n)
	}
	pace, err := firstFreeSlot(ctx, tx, src, lineAt)
	if err != nil {
		return nil, 0, err
	}
	spacingUS := contract.SlotSpacing(pace.Window(), pace.Limit).Microseconds()
	var n int64
	err = tx.QueryRow(ctx, `
		WITH line AS (
			SELECT e.event_id, row_number() OVER (ORDER BY e.ingest_seq NULLS FIRST, coalesce(r.created_at, e.received_at), e.event_id) - 1 AS i
			FROM workflow_events e LEFT JOIN event_ingress_retries r ON r.event_id = e.event_id
			WHERE e.source = $1 AND e.status = 'deferred' AND `+allowedType+`
		), ins AS (
			INSERT INTO event_source_holds (event_id, source, released, slot_at)
			SELECT event_id, $1, true, $2::timestamptz + ((($3::bigint + i) / $4::bigint) * $5::bigint
				+ (($3::bigint + i) % $4::bigint) * $6::bigint) * interval '1 microsecond'
			FROM line
			RETURNING 1
		)
		SELECT count(*) FROM ins`,
		source, pace.From, pace.Skip, pace.Limit, pace.Window().Microseconds(), spacingUS).Scan(&n)
	if err != nil {
		return nil, 0, fmt.Errorf("give held events slots: %w", err)
	}
	if n == 0 {
		return nil, 0, nil
	}
	// The tail of the line, where newcomers take their slots.
	g := int64(pace.Skip) + n - 1
	tail := pace.From.Add(time.Duration(g/int64(pace.Limit)) * pace.Window())
	if _, err := tx.Exec(ctx, `INSERT INTO event_source_slots (source, window_start, taken) VALUES ($1, $2, $3)`,
		source, tail, g%int64(pace.Limit)+1); err != nil {
		return nil, 0, fmt.Errorf("set event source slots: %w", err)
	}
	return pace, n, analyzeLine(ctx, tx, n)
}

// analyzeAtLine is the size of a line worth fresh statistics for.
const analyzeAtLine = 1000

// analyzeLine refreshes the holds table's statistics after a large line
// was added to it (its own rows included: ANALYZE counts the rows its
// transaction inserted). With the statistics of a table that was nearly
// empty, the planner reads a whole line and sorts it for every batch the
// releaser takes, so a release of 100,000 cost milliseconds per event
// instead of microseconds, until autovacuum's next analyze. The function
// (migration 00204) runs ANALYZE as the table's owner, which the
// service's role is not.
func analyzeLine(ctx context.Context, tx pgx.Tx, n int64) error {
	if n < analyzeAtLine {
		return nil
	}
	if _, err := tx.Exec(ctx, `SELECT ingress_analyze_release_line()`); err != nil {
		return fmt.Errorf("analyze release line: %w", err)
	}
	return nil
}

// allowedType keeps out of a release line the deferred events (e) whose
// type the source no longer allows: their due (the scheduler's fallback)
// finds them at the gate, which cancels them. Every change to a source
// lines its events up again, so the line always follows the source's
// current types.
const allowedType = `(SELECT cardinality(s.allowed_types) = 0 OR e.type = ANY(s.allowed_types) FROM event_sources s WHERE s.source = e.source)`

// lineUp puts every deferred event of source, without a rate limit, in
// the release line: in arrival order, a microsecond apart from at.
func lineUp(ctx context.Context, tx pgx.Tx, source string, at time.Time) (int64, error) {
	tag, err := tx.Exec(ctx, `
		INSERT INTO event_source_holds (event_id, source, released, slot_at)
		SELECT e.event_id, $1, true, $2::timestamptz + (row_number() OVER (ORDER BY e.ingest_seq NULLS FIRST, coalesce(r.created_at, e.received_at), e.event_id) - 1)
			* interval '1 microsecond'
		FROM workflow_events e LEFT JOIN event_ingress_retries r ON r.event_id = e.event_id
		WHERE e.source = $1 AND e.status = 'deferred' AND `+allowedType, source, at)
	if err != nil {
		return 0, fmt.Errorf("line up held events: %w", err)
	}
	return tag.RowsAffected(), nil
}

// firstFreeSlot is where a line starting at now begins: in now's window,
// after its admissions so far and after the slots whose time has passed;
// in the next window when none is left. (now may be a pause's end.)
func firstFreeSlot(ctx context.Context, tx pgx.Tx, src Source, now time.Time) (*contract.ReleasePace, error) {
	limit := *src.RateLimit
	start, next := window(now, src.RateWindow)
	var admitted int
	err := tx.QueryRow(ctx, `SELECT coalesce((SELECT admitted FROM event_source_windows WHERE source = $1 AND window_start = $2), 0)`,
		src.Source, start).Scan(&admitted)
	if err != nil {
		return nil, fmt.Errorf("read rate window: %w", err)
	}
	sp := contract.SlotSpacing(src.RateWindow, limit)
	passed := int((now.Sub(start) + sp - 1) / sp)
	p := &contract.ReleasePace{From: start, Skip: max(admitted, passed), Limit: limit, WindowMS: src.RateWindow.Milliseconds()}
	if p.Skip >= limit {
		p.From, p.Skip = next, 0
	}
	return p, nil
}
