package ingressstore

import (
	"context"
	"errors"
	"fmt"
	"time"

	"github.com/jackc/pgx/v5"

	"github.com/retryd/retryd/pkg/contract"
)

// Reasons the gate defers an event; they travel as FailedData.Reason and
// make the scheduler record decided_by=throttle.
const (
	ReasonSourceThrottled = "source_throttled"
	ReasonSourcePaused    = "source_paused"
)

// ErrTypeNotAllowed is returned by Gate when the source restricts its
// types and the event's type is not one of them. Retrying cannot help.
var ErrTypeNotAllowed = errors.New("type not allowed for source")

// Verdict is the gate's decision for one event.
type Verdict struct {
	Admitted bool
	// Reason is ReasonSourceThrottled or ReasonSourcePaused when not
	// admitted.
	Reason string
	// Detail explains the reason for operators ("10 per 1s reached").
	Detail string
	// RetryAt is when the source may admit the event again: the end of the
	// rate window or of the pause; zero for a pause without an end.
	RetryAt time.Time
	// Now is the database time the decision was taken at.
	Now time.Time
	// Before are late holders ahead of an admitted holder, admitted in
	// the same transaction, in line order (see admitLate): the caller
	// publishes them before it. Their dues answer their retries.
	Before []Released
	// count is the admission to count in the source's rate window
	// (CountAdmission); nil when the source has no limit.
	count *admission
}

// holderGrace is how long a slot holder keeps newcomers queued behind it
// after its slot time: its due can be that late (the scheduler re-emits an
// unacknowledged due after 5 minutes) and must still find its place. A
// holder whose event ended some other way (cancelled, admitted by an
// operator) stops counting when its row is deleted or this runs out.
const holderGrace = 6 * time.Minute

// Gate evaluates source for one event (id, type typ) arriving at the gate
// for the first time. While throttled events hold slots (see slot), a
// newcomer queues behind them even if the current window has room: events
// are admitted in arrival order. The caller counts an admission in the
// source's current rate window with CountAdmission, last before it
// commits.
//
// The source row is locked FOR SHARE until tx ends, so a pause or a limit
// change commits either before this decision (and is seen) or after it;
// the window row is incremented with a guarded upsert, so instances that
// evaluate the same source at once never admit more than the limit in a
// window. Windows are fixed: rate_window_ms long, aligned on the Unix epoch,
// measured on the database clock so every instance agrees on them.
func Gate(ctx context.Context, tx pgx.Tx, source, typ, id string) (Verdict, error) {
	return gate(ctx, tx, source, typ, id, false)
}

// GateDue is Gate for an event coming back from a hold. An event that
// holds a slot owns it: it keeps its place in the line of holders (see
// ownTurn), whether its due comes late (it does not lose its place) or
// early (a release's due for a hold applied after the release; an
// operator's retry-now): it does not pass the holders ahead of it. An
// event without a slot (a pause's end, a release without a pace) is a
// newcomer and queues behind the slot holders.
//
// GateDue returns a *WaitError when the holder's turn is a short while
// away: the caller rolls tx back (the hold stays as it was) and hands the
// due back to be delivered at WaitError.Until.
func GateDue(ctx context.Context, tx pgx.Tx, source, typ, id string) (Verdict, error) {
	return gate(ctx, tx, source, typ, id, true)
}

func gate(ctx context.Context, tx pgx.Tx, source, typ, id string, due bool) (Verdict, error) {
	// The clock, not the transaction's start: the gate decides a source's
	// events of a batch in one transaction, and each decision (and the
	// time its held fact carries, the scheduler's held_since) must follow
	// the one before it, as the events arrived.
	var now time.Time
	src, err := scanSource(tx.QueryRow(ctx, `SELECT `+sourceColumns+`, clock_timestamp() FROM event_sources s WHERE s.source = $1 FOR SHARE`, source), &now)
	if errors.Is(err, pgx.ErrNoRows) {
		// No row, no limits.
		return Verdict{Admitted: true}, dropHold(ctx, tx, id)
	}
	if err != nil {
		return Verdict{}, fmt.Errorf("lock event source: %w", err)
	}
	if !src.AllowsType(typ) {
		return Verdict{}, fmt.Errorf("%w: %q is not in the allowed types of source %q", ErrTypeNotAllowed, typ, source)
	}
	owner := false
	var slotAt time.Time
	if due {
		// The hold ends here whatever the verdict: a paused holder waits
		// for the resume's release, which queues it again. (A WaitError
		// or a LineError rolls the transaction back, and with it this
		// delete.)
		var released bool
		err := tx.QueryRow(ctx, `DELETE FROM event_source_holds WHERE event_id = $1 RETURNING slot_at, released`, id).Scan(&slotAt, &released)
		switch {
		case errors.Is(err, pgx.ErrNoRows):
		case err != nil:
			return Verdict{}, fmt.Errorf("end slot hold: %w", err)
		case released && slotAt.Add(releaseLate).After(now):
			// The event waits in a release line, whose releaser admits it
			// in its turn: evaluating its due here would pass the line.
			return Verdict{}, &LineError{Until: slotAt.Add(releaseLate), Now: now}
		default:
			owner = true
		}
	}
	v := Verdict{Now: now}
	if src.PausedAt(now) {
		v.Reason = ReasonSourcePaused
		v.Detail = "source is paused"
		if src.PausedUntil == nil {
			return v, nil
		}
		v.RetryAt = src.PausedUntil.UTC()
		v.Detail += " until " + v.RetryAt.Format(time.RFC3339)
		if src.RateLimit == nil || src.RateWindow <= 0 {
			return v, nil
		}
		// A pause that ends by itself under a rate limit: the event
		// takes its slot of the limit from the pause's end, in arrival
		// order, so the end brings the line back paced, one due per
		// event, instead of all at once (see PaceRelease for a resume).
		from, err := firstFreeSlot(ctx, tx, src, *src.PausedUntil)
		if err != nil {
			return Verdict{}, err
		}
		sv, err := takeSlot(ctx, tx, src, id, from.From, from.Skip)
		if err != nil {
			return Verdict{}, err
		}
		v.RetryAt = sv.at
		v.Detail += fmt.Sprintf(", then the rate limit of %d per %s: slot %d of the window at %s", *src.RateLimit,
			src.RateWindow, sv.taken, sv.window.UTC().Format(time.RFC3339Nano))
		return v, nil
	}
	if src.RateLimit == nil || src.RateWindow <= 0 {
		v.Admitted = true
		return v, nil
	}
	if owner {
		return ownTurn(ctx, tx, v, src, id, slotAt, now)
	}
	queued, err := holdersWaiting(ctx, tx, source, now)
	if err != nil {
		return Verdict{}, err
	}
	if queued {
		return slot(ctx, tx, v, src, id, now)
	}
	start, _ := window(now, src.RateWindow)
	admitted, err := windowAdmitted(ctx, tx, source, start)
	if err != nil {
		return Verdict{}, err
	}
	if admitted >= *src.RateLimit {
		return slot(ctx, tx, v, src, id, now)
	}
	v.Admitted = true
	v.count = &admission{source: source, start: start, limit: *src.RateLimit}
	return v, nil
}

// holdersWaiting reports whether throttled events of source still hold
// slots whose dues have not been evaluated: then a newcomer queues behind
// them.
func holdersWaiting(ctx context.Context, tx pgx.Tx, source string, now time.Time) (bool, error) {
	var waiting bool
	err := tx.QueryRow(ctx, `SELECT EXISTS (SELECT 1 FROM event_source_holds WHERE source = $1 AND slot_at > $2)`,
		source, now.Add(-holderGrace)).Scan(&waiting)
	if err != nil {
		return false, fmt.Errorf("read event source holds: %w", err)
	}
	return waiting, nil
}

// dropHold ends the slot hold of event id, if it has one.
func dropHold(ctx context.Context, db DB, id string) error {
	if _, err := db.Exec(ctx, `DELETE FROM event_source_holds WHERE event_id = $1`, id); err != nil {
		return fmt.Errorf("end slot hold: %w", err)
	}
	return nil
}

// slot throttles event id and gives it the next free slot of the source:
// the tail of the reservations moves forward one slot (to the next
// window's first when its window is full, or when it is behind the
// current window), so held events come back in arrival order, at most
// rate_limit per window, each at its own time. The one statement takes a
// row lock on the source's slot row: concurrent gates queue in a line. The
// event holds its slot (a row of event_source_holds) until its due is
// evaluated; while any event holds one, newcomers queue behind.
func slot(ctx context.Context, tx pgx.Tx, v Verdict, src Source, id string, now time.Time) (Verdict, error) {
	_, next := window(now, src.RateWindow)
	sv, err := takeSlot(ctx, tx, src, id, next, 0)
	if err != nil {
		return Verdict{}, err
	}
	v.Reason = ReasonSourceThrottled
	v.RetryAt = sv.at
	v.Detail = fmt.Sprintf("rate limit of %d per %s reached: slot %d of the window at %s", *src.RateLimit, src.RateWindow, sv.taken,
		sv.window.UTC().Format(time.RFC3339Nano))
	return v, nil
}

// slotTaken is a slot given to an event: its time, its window and its
// place in that window (from 1).
type slotTaken struct {
	at, window time.Time
	taken      int
}

// takeSlot moves the tail of the source's line one slot forward and gives
// that slot to event id. The line never starts before slot skip of the
// window at floor: a tail behind it restarts there.
func takeSlot(ctx context.Context, tx pgx.Tx, src Source, id string, floor time.Time, skip int) (slotTaken, error) {
	limit := *src.RateLimit
	var sv slotTaken
	err := tx.QueryRow(ctx, `
		INSERT INTO event_source_slots AS s (source, window_start, taken) VALUES ($1, $2, $5::int + 1)
		ON CONFLICT (source) DO UPDATE SET
			window_start = CASE
				WHEN s.window_start < $2 OR (s.window_start = $2 AND s.taken < $5) THEN $2
				WHEN s.taken >= $3 THEN s.window_start + $4::bigint * interval '1 millisecond'
				ELSE s.window_start END,
			taken = CASE
				WHEN s.window_start < $2 OR (s.window_start = $2 AND s.taken < $5) THEN $5::int + 1
				WHEN s.taken >= $3 THEN 1
				ELSE s.taken + 1 END
		RETURNING window_start, taken`, src.Source, floor, limit, src.RateWindow.Milliseconds(), skip).Scan(&sv.window, &sv.taken)
	if err != nil {
		return slotTaken{}, fmt.Errorf("take event source slot: %w", err)
	}
	sv.at = sv.window.Add(time.Duration(sv.taken-1) * contract.SlotSpacing(src.RateWindow, limit)).UTC()
	_, err = tx.Exec(ctx, `
		INSERT INTO event_source_holds (event_id, source, slot_at) VALUES ($1, $2, $3)
		ON CONFLICT (event_id) DO UPDATE SET source = EXCLUDED.source, slot_at = EXCLUDED.slot_at, waits_until = NULL`,
		id, src.Source, sv.at)
	if err != nil {
		return slotTaken{}, fmt.Errorf("hold event source slot: %w", err)
	}
	return sv, nil
}

// window returns the fixed window of length d that holds now, aligned on
// the Unix epoch.
func window(now time.Time, d time.Duration) (start, end time.Time) {
	ms := d.Milliseconds()
	startMS := now.UnixMilli() / ms * ms
	start = time.UnixMilli(startMS).UTC()
	return start, start.Add(time.Duration(ms) * time.Millisecond)
}

// PruneWindows deletes rate windows that ended more than keep ago, and
// slot holds whose slot is that old; they no longer decide anything.
func PruneWindows(ctx context.Context, db DB, keep time.Duration) (int64, error) {
	tag, err := db.Exec(ctx, `
		DELETE FROM event_source_windows w
		WHERE w.window_start
		      + coalesce((SELECT s.rate_window_ms FROM event_sources s WHERE s.source = w.source), 0) * interval '1 millisecond'
		      < now() - $1 * interval '1 millisecond'`, keep.Milliseconds())
	if err != nil {
		return 0, fmt.Errorf("prune rate windows: %w", err)
	}
	if _, err := db.Exec(ctx, `DELETE FROM event_source_holds WHERE slot_at < now() - $1 * interval '1 millisecond'`,
		keep.Milliseconds()); err != nil {
		return 0, fmt.Errorf("prune slot holds: %w", err)
	}
	return tag.RowsAffected(), nil
}
