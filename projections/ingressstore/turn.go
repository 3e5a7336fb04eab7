package ingressstore

import (
	"context"
	"errors"
	"fmt"
	"time"

	"github.com/jackc/pgx/v5"
)

// maxTurnWait is the longest a slot holder's due is handed back to wait
// for its turn. A turn farther away becomes a hold of its own, through the
// scheduler, so no due waits unacknowledged for long: the scheduler
// re-emits a due nobody answered within its RedueAfter (5 minutes).
const maxTurnWait = time.Minute

// A holder waiting for its turn is waited for until turnLate after that
// turn: its due comes back a little after the turn (the redelivery's own
// latency), and the holders behind it must not pass it then. One whose due
// does not come by turnLate (its ingress died; the due returns after the
// ack wait) is no longer waited for. A holder behind one that is late for
// its turn looks again every turnRecheck.
const (
	turnLate    = 5 * time.Second
	turnRecheck = 20 * time.Millisecond
)

// WaitError is GateDue's answer to a slot holder whose turn has not come:
// holders ahead of it in line still wait, or this window is full. The
// caller rolls back (the hold keeps its place) and hands the due back to
// be delivered at Until. Handing back is a redelivery of the same due, not
// a new one: waiting costs the scheduler nothing.
type WaitError struct {
	Until time.Time
	// Now is the database time the turn was computed at: wait
	// Until.Sub(Now), never against a local clock (which may be skewed).
	Now time.Time
	// Ahead is how many holders of the source are before this one in line.
	Ahead int
}

func (e *WaitError) Error() string {
	return fmt.Sprintf("slot holder waits for its turn at %s behind %d held events", e.Until.UTC().Format(time.RFC3339Nano), e.Ahead)
}

// ownTurn decides for a slot holder whose due has come (slotAt is its
// place in line). It is admitted when the current window has room for it
// behind the holders still ahead of it; a due that comes late into a
// window other holders fill keeps its place instead of going to the back
// of the line: the holders behind it move back. When its turn is a short
// while away it waits (a *WaitError); when it is farther, it is held
// again for its turn, in the same place.
func ownTurn(ctx context.Context, tx pgx.Tx, v Verdict, src Source, id string, slotAt, now time.Time) (Verdict, error) {
	limit := *src.RateLimit
	ahead, waiting, err := holdersAhead(ctx, tx, src.Source, slotAt, now)
	if err != nil {
		return Verdict{}, err
	}
	start, next := window(now, src.RateWindow)
	var counted bool
	var admitted int
	if waiting.IsZero() {
		if counted, admitted, err = countIn(ctx, tx, src.Source, start, limit, ahead); err != nil {
			return Verdict{}, err
		}
	}
	if counted {
		v.Admitted = true
		return v, nil
	}
	at := turnAt(next, src.RateWindow, limit, max(ahead-max(limit-admitted, 0), 0))
	if !waiting.IsZero() {
		// Behind a holder waiting for its turn: right after it, and not
		// before it has had a moment to come.
		at = maxTime(at, maxTime(waiting.Add(turnGap(src.RateWindow, limit)), now.Add(turnRecheck)))
	}
	if at.Sub(now) <= maxTurnWait {
		return Verdict{}, &WaitError{Until: at, Now: now, Ahead: ahead}
	}
	if _, err := tx.Exec(ctx, `INSERT INTO event_source_holds (event_id, source, slot_at) VALUES ($1, $2, $3)`,
		id, src.Source, slotAt); err != nil {
		return Verdict{}, fmt.Errorf("keep event source slot: %w", err)
	}
	v.Reason = ReasonSourceThrottled
	v.RetryAt = at
	v.Detail = fmt.Sprintf("rate limit of %d per %s reached: %d held events ahead, turn at %s", limit, src.RateWindow, ahead,
		at.Format(time.RFC3339Nano))
	return v, nil
}

// turnAt is when the holder with p holders before it in line, counted
// from the window starting at next, can be admitted: in the window
// p/limit after next. Holders of one window come back at its start, a
// millisecond apart at most in line order, so the ones ahead are
// evaluated first.
func turnAt(next time.Time, w time.Duration, limit, p int) time.Time {
	return next.Add(time.Duration(p/limit)*w + time.Duration(p%limit)*turnGap(w, limit)).UTC()
}

// turnGap is the time between two turns in line within a window: the
// slot spacing, at most a millisecond.
func turnGap(w time.Duration, limit int) time.Duration {
	return min(spacing(w, limit), time.Millisecond)
}

func maxTime(a, b time.Time) time.Time {
	if a.After(b) {
		return a
	}
	return b
}

// holdersAhead counts the holders of source in line before the one at
// slotAt: their slots are earlier and they have not been admitted. It also
// returns the latest turn one of them waits for, or waited for less than
// turnLate ago (zero when none does).
// A holder past holderGrace no longer counts (its due may be lost; the
// scheduler's re-emission still finds its row).
func holdersAhead(ctx context.Context, tx pgx.Tx, source string, slotAt, now time.Time) (int, time.Time, error) {
	var n int
	var waiting *time.Time
	err := tx.QueryRow(ctx, `
		SELECT count(*), max(waits_until) FILTER (WHERE waits_until > $4)
		FROM event_source_holds WHERE source = $1 AND slot_at > $2 AND slot_at < $3`,
		source, now.Add(-holderGrace), slotAt, now.Add(-turnLate)).Scan(&n, &waiting)
	if err != nil {
		return 0, time.Time{}, fmt.Errorf("count holders ahead: %w", err)
	}
	if waiting == nil {
		return n, time.Time{}, nil
	}
	return n, *waiting, nil
}

// MarkWaiting records that the holder of event id waits for its turn at
// until (after GateDue's WaitError, outside the rolled-back transaction),
// so holders behind it that come first wait behind it. A hold that has
// ended since is left alone. Losing this mark (a crash in between) costs
// order at most, never an event.
func MarkWaiting(ctx context.Context, db DB, id string, until time.Time) error {
	if _, err := db.Exec(ctx, `UPDATE event_source_holds SET waits_until = $2 WHERE event_id = $1`, id, until); err != nil {
		return fmt.Errorf("mark slot holder waiting: %w", err)
	}
	return nil
}

// countIn counts one admission in source's rate window at start if the
// window has room for it behind ahead others; it reports whether it did,
// and else how many the window has admitted. The guarded upsert keeps
// instances that evaluate the same source at once within the limit.
func countIn(ctx context.Context, tx pgx.Tx, source string, start time.Time, limit, ahead int) (bool, int, error) {
	var admitted int
	if ahead < limit {
		err := tx.QueryRow(ctx, `
			INSERT INTO event_source_windows (source, window_start, admitted)
			VALUES ($1, $2, 1)
			ON CONFLICT (source, window_start) DO UPDATE SET admitted = event_source_windows.admitted + 1
			WHERE event_source_windows.admitted + $4 < $3
			RETURNING admitted`, source, start, limit, ahead).Scan(&admitted)
		switch {
		case err == nil:
			return true, admitted, nil
		case !errors.Is(err, pgx.ErrNoRows):
			return false, 0, fmt.Errorf("count event in rate window: %w", err)
		}
	}
	err := tx.QueryRow(ctx, `SELECT coalesce((SELECT admitted FROM event_source_windows WHERE source = $1 AND window_start = $2), 0)`,
		source, start).Scan(&admitted)
	if err != nil {
		return false, 0, fmt.Errorf("read rate window: %w", err)
	}
	return false, admitted, nil
}
