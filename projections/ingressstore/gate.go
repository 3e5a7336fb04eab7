package ingressstore

import (
	"context"
	"errors"
	"fmt"
	"time"

	"github.com/jackc/pgx/v5"
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
}

// Gate evaluates source for one event of type typ arriving at the gate
// for the first time and, when it admits, counts the event in the source's
// current rate window. While throttled events wait for their slots (see
// slot), a new event queues behind them even if the current window has
// room: events are admitted in arrival order.
//
// The source row is locked FOR SHARE until tx ends, so a pause or a limit
// change commits either before this decision (and is seen) or after it;
// the window row is incremented with a guarded upsert, so instances that
// evaluate the same source at once never admit more than the limit in a
// window. Windows are fixed: rate_window_ms long, aligned on the Unix epoch,
// measured on the database clock so every instance agrees on them.
func Gate(ctx context.Context, tx pgx.Tx, source, typ string) (Verdict, error) {
	return gate(ctx, tx, source, typ, true)
}

// GateDue is Gate for an event that comes back from a hold (its due): it
// does not queue behind the slots, it is their owner. A throttled event
// due at its slot finds room in its window, since new events queued
// behind it.
func GateDue(ctx context.Context, tx pgx.Tx, source, typ string) (Verdict, error) {
	return gate(ctx, tx, source, typ, false)
}

func gate(ctx context.Context, tx pgx.Tx, source, typ string, fresh bool) (Verdict, error) {
	var now time.Time
	src, err := scanSource(tx.QueryRow(ctx, `SELECT `+sourceColumns+`, now() FROM event_sources s WHERE s.source = $1 FOR SHARE`, source), &now)
	if errors.Is(err, pgx.ErrNoRows) {
		// No row, no limits.
		return Verdict{Admitted: true}, nil
	}
	if err != nil {
		return Verdict{}, fmt.Errorf("lock event source: %w", err)
	}
	if !src.AllowsType(typ) {
		return Verdict{}, fmt.Errorf("%w: %q is not in the allowed types of source %q", ErrTypeNotAllowed, typ, source)
	}
	v := Verdict{Now: now}
	if src.PausedAt(now) {
		v.Reason = ReasonSourcePaused
		v.Detail = "source is paused"
		if src.PausedUntil != nil {
			v.RetryAt = src.PausedUntil.UTC()
			v.Detail += " until " + v.RetryAt.Format(time.RFC3339)
		}
		return v, nil
	}
	if src.RateLimit == nil || src.RateWindow <= 0 {
		v.Admitted = true
		return v, nil
	}
	if fresh {
		queued, err := slotsPending(ctx, tx, source, src.RateWindow, *src.RateLimit, now)
		if err != nil {
			return Verdict{}, err
		}
		if queued {
			return slot(ctx, tx, v, src, now)
		}
	}
	start, _ := window(now, src.RateWindow)
	var admitted int
	err = tx.QueryRow(ctx, `
		INSERT INTO event_source_windows (source, window_start, admitted)
		VALUES ($1, $2, 1)
		ON CONFLICT (source, window_start) DO UPDATE SET admitted = event_source_windows.admitted + 1
		WHERE event_source_windows.admitted < $3
		RETURNING admitted`, source, start, *src.RateLimit).Scan(&admitted)
	switch {
	case errors.Is(err, pgx.ErrNoRows):
		return slot(ctx, tx, v, src, now)
	case err != nil:
		return Verdict{}, fmt.Errorf("count event in rate window: %w", err)
	}
	v.Admitted = true
	return v, nil
}

// spacing is the time between two slots of a window: rate_window /
// rate_limit in whole microseconds, at least one. Slots are then exact in
// the database's precision: a due that comes back at its slot carries the
// time the scheduler stored, and must not look a fraction early (it would
// queue behind the slots instead of owning one).
func spacing(w time.Duration, limit int) time.Duration {
	return max((w / time.Duration(max(limit, 1))).Truncate(time.Microsecond), time.Microsecond)
}

// slotsPending reports whether throttled events of source still wait for
// slots after now: then a new event must queue behind them.
func slotsPending(ctx context.Context, tx pgx.Tx, source string, w time.Duration, limit int, now time.Time) (bool, error) {
	var pending bool
	err := tx.QueryRow(ctx, `SELECT EXISTS (SELECT 1 FROM event_source_slots
		WHERE source = $1 AND window_start + (taken - 1) * $2::bigint * interval '1 microsecond' > $3)`,
		source, spacing(w, limit).Microseconds(), now).Scan(&pending)
	if err != nil {
		return false, fmt.Errorf("read event source slots: %w", err)
	}
	return pending, nil
}

// slot throttles the event and gives it the next free slot of the source:
// the tail of the reservations moves forward one slot (to the next
// window's first when its window is full, or when it is behind the
// current window), so held events come back in arrival order, at most
// rate_limit per window, each at its own time. The one statement takes a
// row lock on the source's slot row: concurrent gates queue in a line.
func slot(ctx context.Context, tx pgx.Tx, v Verdict, src Source, now time.Time) (Verdict, error) {
	_, next := window(now, src.RateWindow)
	limit := *src.RateLimit
	var start time.Time
	var taken int
	err := tx.QueryRow(ctx, `
		INSERT INTO event_source_slots AS s (source, window_start, taken) VALUES ($1, $2, 1)
		ON CONFLICT (source) DO UPDATE SET
			window_start = CASE
				WHEN s.window_start < $2 THEN $2
				WHEN s.taken >= $3 THEN s.window_start + $4::bigint * interval '1 millisecond'
				ELSE s.window_start END,
			taken = CASE WHEN s.window_start < $2 OR s.taken >= $3 THEN 1 ELSE s.taken + 1 END
		RETURNING window_start, taken`, src.Source, next, limit, src.RateWindow.Milliseconds()).Scan(&start, &taken)
	if err != nil {
		return Verdict{}, fmt.Errorf("take event source slot: %w", err)
	}
	v.Reason = ReasonSourceThrottled
	v.RetryAt = start.Add(time.Duration(taken-1) * spacing(src.RateWindow, limit)).UTC()
	v.Detail = fmt.Sprintf("rate limit of %d per %s reached: slot %d of the window at %s", limit, src.RateWindow, taken,
		start.UTC().Format(time.RFC3339Nano))
	return v, nil
}

// window returns the fixed window of length d that holds now, aligned on
// the Unix epoch.
func window(now time.Time, d time.Duration) (start, end time.Time) {
	ms := d.Milliseconds()
	startMS := now.UnixMilli() / ms * ms
	start = time.UnixMilli(startMS).UTC()
	return start, start.Add(time.Duration(ms) * time.Millisecond)
}

// PruneWindows deletes rate windows that ended more than keep ago; they no
// longer decide anything.
func PruneWindows(ctx context.Context, db DB, keep time.Duration) (int64, error) {
	tag, err := db.Exec(ctx, `
		DELETE FROM event_source_windows w
		WHERE w.window_start
		      + coalesce((SELECT s.rate_window_ms FROM event_sources s WHERE s.source = w.source), 0) * interval '1 millisecond'
		      < now() - $1 * interval '1 millisecond'`, keep.Milliseconds())
	if err != nil {
		return 0, fmt.Errorf("prune rate windows: %w", err)
	}
	return tag.RowsAffected(), nil
}
