package ingressstore

import (
	"context"
	"errors"
	"fmt"
	"time"

	"github.com/jackc/pgx/v5"

	"github.com/retryd/retryd/pkg/contract"
)

// maxTurnWait is the longest a slot holder's due is handed back to wait
// for its turn. A turn farther away becomes a hold of its own, through the
// scheduler, so no due waits unacknowledged for long: the scheduler
// re-emits a due nobody answered within its RedueAfter (5 minutes).
const maxTurnWait = time.Minute

// A holder waiting for its turn (its due handed back) blocks the holders
// behind it until turnLate after that turn: its redelivery comes a few
// milliseconds either side of the turn, and the holders behind it must not
// pass it then. While the window has room for it and them, they look
// again right after it, at least turnRecheck later, not at the next
// window. One whose due does not come by turnLate (its ingress died; the
// due returns after the ack wait) is not waited for any longer: the next
// holder admitted behind it admits it first (admitLate), so the line goes
// on in order without its due. (Waiting for it up to 5 s, and at the next
// window, let one late holder hold the whole line: a paced release
// admitted one or two events a window. Passing it instead, as until
// 2026-11-27, put it out of place.)
const (
	turnLate    = 100 * time.Millisecond
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
	// Behind is true when the window has room for this holder and it
	// waits only behind a holder ahead of it that waits for its turn. The
	// caller then does not mark it waiting (MarkWaiting): the holders
	// after it wait for the one it waits for, each by its place in line,
	// rather than for each other in a chain.
	Behind bool
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
// again for its turn, in the same place. Late holders ahead of it are
// admitted with it, first (Verdict.Before).
func ownTurn(ctx context.Context, tx pgx.Tx, v Verdict, src Source, id string, slotAt, now time.Time) (Verdict, error) {
	limit := *src.RateLimit
	h, err := holdersAhead(ctx, tx, src.Source, slotAt, now)
	if err != nil {
		return Verdict{}, err
	}
	ahead, waiting := h.ahead, h.waiting
	gap := turnGap(src.RateWindow, limit)
	if h.lined {
		// Events of a release line ahead of it whose slots have come:
		// the releaser admits them at its next pass (every releaseTick),
		// and admitting this one now would pass them.
		return Verdict{}, &WaitError{Until: now.Add(turnRecheck), Now: now, Ahead: ahead, Behind: true}
	}
	start, next := window(now, src.RateWindow)
	admitted, err := windowAdmitted(ctx, tx, src.Source, start)
	if err != nil {
		return Verdict{}, err
	}
	fits := admitted+ahead < limit
	if fits && waiting.IsZero() {
		if h.come {
			// A holder ahead whose slot has come is not admitted yet:
			// its due is on its way or was handed back a moment ago to
			// wait behind another. Admitting this one would pass it; it
			// looks again in a moment. (When the window has no room, its
			// turn below already counts the one ahead.)
			return Verdict{}, &WaitError{Until: now.Add(turnRecheck), Now: now, Ahead: ahead, Behind: true}
		}
		var late []Released
		if h.late {
			if late, err = admitLate(ctx, tx, src.Source, slotAt, now); err != nil {
				return Verdict{}, err
			}
		}
		v.Admitted, v.Before = true, late
		v.count = &admission{source: src.Source, start: start, limit: limit, ahead: ahead, before: len(late)}
		return v, nil
	}
	if fits {
		// Room for it, behind a holder waiting for its turn: after that
		// turn, by its place in line, and not before the waiting one has
		// had a moment to come.
		at := maxTime(waiting, now.Add(turnRecheck)).Add(time.Duration(ahead) * gap)
		return Verdict{}, &WaitError{Until: at, Now: now, Ahead: ahead, Behind: true}
	}
	at := turnAt(next, src.RateWindow, limit, ahead-max(limit-admitted, 0))
	if !waiting.IsZero() {
		at = maxTime(at, maxTime(waiting.Add(gap), now.Add(turnRecheck)))
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
	return min(contract.SlotSpacing(w, limit), time.Millisecond)
}

func maxTime(a, b time.Time) time.Time {
	if a.After(b) {
		return a
	}
	return b
}

// lineAhead is what holdersAhead found before a holder in line.
type lineAhead struct {
	// ahead is how many holders are before it.
	ahead int
	// waiting is the latest turn one of them waits for, or waited for
	// less than turnLate ago (zero when none does).
	waiting time.Time
	// lined: one of them is in a release line with its slot come (its
	// releaser admits it in a moment; one whose slot passed releaseLate
	// ago has no releaser running).
	lined bool
	// come: one of them, not in a release line, has its slot come less
	// than turnLate ago and is not admitted yet.
	come bool
	// late: one of them, not in a release line, has its slot come (with
	// come and waiting unset: more than turnLate ago, see admitLate).
	late bool
}

// holdersAhead reads the holders of source in line before the one at
// slotAt: their slots are earlier and they have not been admitted. A
// holder past holderGrace no longer counts (its due may be lost; the
// scheduler's re-emission still finds its row).
func holdersAhead(ctx context.Context, tx pgx.Tx, source string, slotAt, now time.Time) (lineAhead, error) {
	var h lineAhead
	var waiting *time.Time
	err := tx.QueryRow(ctx, `
		SELECT count(*), max(waits_until) FILTER (WHERE waits_until > $4),
			coalesce(bool_or(released AND slot_at <= $5 AND slot_at > $6), false),
			coalesce(bool_or(NOT released AND slot_at <= $5 AND slot_at > $4), false),
			coalesce(bool_or(NOT released AND slot_at <= $5), false)
		FROM event_source_holds WHERE source = $1 AND slot_at > $2 AND slot_at < $3`,
		source, now.Add(-holderGrace), slotAt, now.Add(-turnLate), now, now.Add(-releaseLate)).Scan(&h.ahead, &waiting, &h.lined, &h.come, &h.late)
	if err != nil {
		return lineAhead{}, fmt.Errorf("count holders ahead: %w", err)
	}
	if waiting != nil {
		h.waiting = *waiting
	}
	return h, nil
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

// admission is an admission the gate decided and the caller counts in a
// rate window when it commits (CountAdmission): the event, and before
// holders admitted ahead of it (Verdict.Before).
type admission struct {
	source               string
	start                time.Time
	limit, ahead, before int
}

// ErrWindowFilled is CountAdmission's answer when the rate window filled
// between the gate's decision and the count (another gate of the source
// admitted meanwhile). The caller rolls back and evaluates the event
// again shortly; nothing was admitted.
var ErrWindowFilled = errors.New("rate window filled while the gate decided")

// CountAdmission counts admitted verdict v in its source's rate window;
// nothing to do for a source without a rate limit. Call it last in the
// transaction, right before the commit: the window's row is then locked
// for the commit only, and the gates of one source do not queue behind
// each other's writes. The guarded upsert keeps instances that evaluate
// the same source at once within the limit: when the window has no room
// left behind the holders ahead of the event, it returns ErrWindowFilled.
// (The holders admitted with it, Verdict.Before, are among those ahead:
// the guard is the same, and they count too.)
func CountAdmission(ctx context.Context, tx pgx.Tx, v Verdict) error {
	a := v.count
	if !v.Admitted || a == nil {
		return nil
	}
	var admitted int
	err := tx.QueryRow(ctx, `
		INSERT INTO event_source_windows (source, window_start, admitted)
		VALUES ($1, $2, $5)
		ON CONFLICT (source, window_start) DO UPDATE SET admitted = event_source_windows.admitted + $5
		WHERE event_source_windows.admitted + $4 < $3
		RETURNING admitted`, a.source, a.start, a.limit, a.ahead, 1+a.before).Scan(&admitted)
	switch {
	case errors.Is(err, pgx.ErrNoRows):
		return fmt.Errorf("count event in rate window of %s: %w", a.source, ErrWindowFilled)
	case err != nil:
		return fmt.Errorf("count event in rate window: %w", err)
	}
	return nil
}

// windowAdmitted reads how many events source's rate window at start has
// admitted (without a lock: CountAdmission checks again).
func windowAdmitted(ctx context.Context, tx pgx.Tx, source string, start time.Time) (int, error) {
	var admitted int
	err := tx.QueryRow(ctx, `SELECT coalesce((SELECT admitted FROM event_source_windows WHERE source = $1 AND window_start = $2), 0)`,
		source, start).Scan(&admitted)
	if err != nil {
		return 0, fmt.Errorf("read rate window: %w", err)
	}
	return admitted, nil
}
