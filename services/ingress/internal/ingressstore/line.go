package ingressstore

import (
	"context"
	"errors"
	"fmt"
	"time"

	"github.com/jackc/pgx/v5"

	"github.com/retryd/retryd/internal/pgrows"
)

// windowStartSQL is the start of the rate window of ms milliseconds (a SQL
// expression) that holds now(), on the database clock: the fixed,
// epoch-aligned windows of window(), in SQL.
func windowStartSQL(ms string) string {
	return "to_timestamp((floor(extract(epoch FROM now()) * 1000)::bigint / " + ms + " * " + ms + ") / 1000.0)"
}

// Released is an event AdmitReleased admitted: what its admission
// publishes (the event, and the succeeded that closes its retry).
type Released struct {
	Event
	// Attempt is the attempt the admission completes (the one the
	// scheduler's due would have carried); 0 when the event had no retry
	// row, and then no retry to close.
	Attempt int
}

func scanReleased(row pgx.Row) (Released, error) {
	var r Released
	err := row.Scan(&r.ID, &r.Source, &r.Type, &r.Status, &r.Envelope, &r.ReceivedAt, &r.AdmittedAt, &r.UpdatedAt, &r.Attempt)
	return r, err
}

// admitLineCTEs admits the events of a CTE named line (event_id,
// slot_at), whose rows the statement locked, at admittedAt (an SQL
// expression): each deferred one goes to admitted (CTE moved), every one
// leaves the line, and each moved one completes its retry row (CTE
// completed). The statement ends with admittedLine.
func admitLineCTEs(admittedAt string) string {
	// The writes find their rows by "= ANY(ARRAY(SELECT ...))", an index
	// lookup per id: joined to the CTEs instead, the planner hashes whole
	// tables (every event the source ever had), which made a batch cost
	// tens of milliseconds whatever its size and held a paced release (a
	// small batch every tick) to a few hundred events a second.
	return `moved AS (
	UPDATE workflow_events e SET status = 'admitted', admitted_at = ` + admittedAt + `, updated_at = now()
	WHERE e.event_id = ANY(ARRAY(SELECT event_id FROM line)) AND e.status = 'deferred'
	RETURNING e.event_id, e.source, e.type, e.status, e.envelope, e.received_at, e.admitted_at, e.updated_at
), dropped AS (
	DELETE FROM event_source_holds h WHERE h.event_id = ANY(ARRAY(SELECT event_id FROM line))
), completed AS (
	UPDATE event_ingress_retries r
	SET retry_state = 'completed', attempts = greatest(r.scheduled_attempt, r.attempts + 1), next_attempt_at = NULL, updated_at = now()
	WHERE r.event_id = ANY(ARRAY(SELECT event_id FROM moved))
	RETURNING r.event_id, r.attempts
)`
}

// admittedLine returns what admitLineCTEs admitted, as scanReleased reads
// it, in line order.
const admittedLine = `
SELECT m.event_id, m.source, m.type, m.status, m.envelope, m.received_at, m.admitted_at, m.updated_at, coalesce(c.attempts, 0)
FROM moved m JOIN line l ON l.event_id = m.event_id LEFT JOIN completed c ON c.event_id = m.event_id
ORDER BY l.slot_at, m.event_id`

// AdmitReleased admits up to limit events of one release line (see
// PaceRelease) whose slots have come, oldest slot first: each goes from
// deferred to admitted, leaves the line, completes its retry, and counts
// in its source's rate window. The caller publishes them (outbox) in the
// same transaction, in the order returned, which is the line's.
//
// The line is the one with the oldest slot that has come among sources
// that are not paused and whose current rate window has room; it admits
// at most that room, so a window never admits more than the limit, even
// when slots of the window before come a few milliseconds late: those
// take room in this window, and the line moves back by as much.
//
// Holds or events another transaction has locked (an instance admitting
// the same line, a due evaluating one of them) are skipped, so instances
// share a line without waiting for each other; the source row is locked FOR SHARE,
// so a pause commits either before (and nothing of the source is admitted)
// or after this transaction.
func AdmitReleased(ctx context.Context, tx pgx.Tx, limit int) ([]Released, error) {
	var source string
	var room int
	var rateLimit, windowMS *int64
	err := tx.QueryRow(ctx, `
WITH open AS (
	SELECT s.source, s.rate_limit, s.rate_window_ms, l.slot_at FROM event_sources s
	CROSS JOIN LATERAL (SELECT h.slot_at FROM event_source_holds h WHERE h.source = s.source AND h.released
		ORDER BY h.slot_at LIMIT 1) l
	WHERE l.slot_at <= now() AND NOT (s.paused AND (s.paused_until IS NULL OR s.paused_until > now()))
	FOR SHARE OF s
), room AS (
	SELECT o.source, o.slot_at, o.rate_limit, o.rate_window_ms, CASE WHEN o.rate_limit IS NULL OR coalesce(o.rate_window_ms, 0) <= 0 THEN $1::int
		ELSE least($1::int, o.rate_limit - coalesce((SELECT w.admitted FROM event_source_windows w WHERE w.source = o.source
			AND w.window_start = `+windowStartSQL("o.rate_window_ms")+`), 0))
		END AS room
	FROM open o
)
SELECT r.source, r.room, r.rate_limit, r.rate_window_ms FROM room r
WHERE r.room > 0
ORDER BY r.slot_at
LIMIT 1`, limit).Scan(&source, &room, &rateLimit, &windowMS)
	if errors.Is(err, pgx.ErrNoRows) {
		return nil, nil
	}
	if err != nil {
		return nil, fmt.Errorf("pick a release line: %w", err)
	}
	if rateLimit != nil && windowMS != nil && *windowMS > 0 {
		// The room again, under the window row's lock, held to the commit:
		// another instance's releaser, or a gate counting an admission,
		// waits for this batch, so the window never admits more than the
		// limit.
		var admitted int64
		err := tx.QueryRow(ctx, `
			INSERT INTO event_source_windows AS w (source, window_start, admitted)
			VALUES ($1, `+windowStartSQL("$2::bigint")+`, 0)
			ON CONFLICT (source, window_start) DO UPDATE SET admitted = w.admitted
			RETURNING admitted`, source, *windowMS).Scan(&admitted)
		if err != nil {
			return nil, fmt.Errorf("lock rate window of %s: %w", source, err)
		}
		if room = min(room, int(*rateLimit-admitted)); room <= 0 {
			return nil, nil
		}
	}
	out, err := pgrows.All(ctx, tx, "admit released events of "+source, scanReleased, `
WITH src AS (
	SELECT s.source, s.rate_limit, s.rate_window_ms FROM event_sources s WHERE s.source = $1
), line AS (
	-- The event row too, skipped when locked: a due evaluating the event
	-- holds it, and may delete this hold next (waiting for it here would
	-- be a deadlock).
	SELECT h.event_id, h.slot_at FROM event_source_holds h JOIN workflow_events e ON e.event_id = h.event_id
	WHERE h.source = $1 AND h.released AND h.slot_at <= now()
	ORDER BY h.slot_at, h.event_id
	LIMIT $2
	FOR UPDATE OF h, e SKIP LOCKED
), `+admitLineCTEs("now()")+`, counted AS (
	INSERT INTO event_source_windows AS w (source, window_start, admitted)
	SELECT src.source, `+windowStartSQL("src.rate_window_ms")+`,
		(SELECT count(*) FROM moved)
	FROM src
	WHERE src.rate_limit IS NOT NULL AND src.rate_window_ms > 0 AND EXISTS (SELECT 1 FROM moved)
	ON CONFLICT (source, window_start) DO UPDATE SET admitted = w.admitted + EXCLUDED.admitted
)
`+admittedLine, source, room)
	if err != nil {
		return nil, err
	}
	if len(out) == 0 {
		// Nothing taken although the line's head has come: its events are
		// locked by dues (they are let go in a moment), or a hold outlived
		// its event's deferral. Those go, so they cannot hold the line.
		if _, err := tx.Exec(ctx, `DELETE FROM event_source_holds h
			WHERE h.source = $1 AND h.released AND h.slot_at <= now()
			  AND NOT EXISTS (SELECT 1 FROM workflow_events e WHERE e.event_id = h.event_id AND e.status = 'deferred')`, source); err != nil {
			return nil, fmt.Errorf("drop stale holds of %s: %w", source, err)
		}
	}
	return out, nil
}

// NextReleaseSlot is how long until a release line can move next (0 when
// one can now), on the database clock: at its oldest slot, but not before
// its paused source's pause ends (never, for a pause without an end) nor
// while its source's current rate window is full (then at the next
// window). False when no line can move before a change to a source (which
// wakes the releaser).
func NextReleaseSlot(ctx context.Context, db DB) (time.Duration, bool, error) {
	var us *int64
	err := db.QueryRow(ctx, `
		WITH lines AS (
			SELECT s.source, l.slot_at FROM event_sources s
			CROSS JOIN LATERAL (SELECT h.slot_at FROM event_source_holds h WHERE h.source = s.source AND h.released
				ORDER BY h.slot_at LIMIT 1) l
		), nexts AS (
			SELECT CASE
				WHEN s.paused AND s.paused_until IS NULL THEN NULL
				WHEN s.paused AND s.paused_until > now() THEN greatest(l.slot_at, s.paused_until)
				WHEN s.rate_limit IS NOT NULL AND s.rate_window_ms > 0 AND coalesce(w.admitted, 0) >= s.rate_limit
					THEN greatest(l.slot_at, ws.start + s.rate_window_ms * interval '1 millisecond')
				ELSE l.slot_at END AS next
			FROM lines l JOIN event_sources s ON s.source = l.source
			CROSS JOIN LATERAL (SELECT CASE WHEN s.rate_window_ms > 0 THEN `+windowStartSQL("s.rate_window_ms")+` END AS start) ws
			LEFT JOIN event_source_windows w ON w.source = s.source AND w.window_start = ws.start
		)
		SELECT CASE WHEN min(next) IS NOT NULL THEN (extract(epoch FROM greatest(min(next) - now(), interval '0')) * 1000000)::bigint END
		FROM nexts`).Scan(&us)
	if err != nil {
		return 0, false, fmt.Errorf("read next release slot: %w", err)
	}
	if us == nil {
		return 0, false, nil
	}
	return time.Duration(*us) * time.Microsecond, true, nil
}

// releaseLate is how long past its slot an event of a release line waits
// for a releaser before its due (the scheduler's fallback) evaluates it
// like any other held event: a line that far behind has no releaser
// running (every ingress down).
const releaseLate = time.Minute

// LineError is GateDue's answer to a due for an event that waits in a
// release line: its releaser admits it, so the caller rolls the due back
// (no inbox claim, no trace) and hands it back until Until, when the event
// is admitted or, if it left the line (its type no longer allowed, a pause
// long enough for the prune), evaluated like any other.
type LineError struct {
	// Until is releaseLate after the event's slot; Now the database time
	// it was computed at (wait Until.Sub(Now), never against a local
	// clock).
	Until, Now time.Time
}

func (e *LineError) Error() string {
	return "event waits in a release line until " + e.Until.UTC().Format(time.RFC3339Nano)
}
