package ingressstore

import (
	"context"
	"encoding/json"
	"fmt"
	"time"

	"github.com/jackc/pgx/v5"

	"github.com/retryd/retryd/internal/pgrows"
	"github.com/retryd/retryd/stores/pgtext"
)

// RetryState is event_ingress_retries.retry_state.
type RetryState string

const (
	// RetryScheduled is a deferral waiting for its next attempt. Until the
	// scheduler confirms it (ScheduledAttempt > Attempts) the reconciler may
	// publish its failed event again.
	RetryScheduled RetryState = "scheduled"
	// RetryDue is reserved for owners that hand a due item to slow work;
	// ingress decides a due event in the transaction that consumes it.
	RetryDue RetryState = "due"
	// RetryCompleted is a deferral that was admitted.
	RetryCompleted RetryState = "completed"
	// RetryCancelled is a deferral an operator cancelled.
	RetryCancelled RetryState = "cancelled"
	// RetryExhausted is a deferral the scheduler gave up on.
	RetryExhausted RetryState = "exhausted"
)

// Retry is a row of event_ingress_retries: one per deferred event.
type Retry struct {
	EventID string
	Source  string
	State   RetryState
	// Attempts is the last attempt the gate evaluated: 1 is the first
	// evaluation, n the (n-1)th retry.
	Attempts int
	// ScheduledAttempt is the attempt the scheduler last confirmed with
	// scheduled/rescheduled (Attempts+1 when confirmed).
	ScheduledAttempt int
	NextAttemptAt    *time.Time
	// LastError is the last reason with its detail, e.g.
	// "source_throttled: rate limit of 10 per 1s reached".
	LastError string
	Metadata  map[string]any
	CreatedAt time.Time
	UpdatedAt time.Time
}

// Confirmed reports whether the scheduler acknowledged the current
// deferral.
func (r Retry) Confirmed() bool { return r.ScheduledAttempt > r.Attempts }

const retryColumns = `event_id, source, retry_state, attempts, scheduled_attempt, next_attempt_at, last_error, metadata, created_at, updated_at`

func scanRetry(row pgx.Row) (Retry, error) {
	var r Retry
	var state string
	var md []byte
	if err := row.Scan(&r.EventID, &r.Source, &state, &r.Attempts, &r.ScheduledAttempt, &r.NextAttemptAt, &r.LastError, &md, &r.CreatedAt, &r.UpdatedAt); err != nil {
		return Retry{}, err
	}
	r.State = RetryState(state)
	r.Metadata = map[string]any{}
	if len(md) > 0 {
		if err := json.Unmarshal(md, &r.Metadata); err != nil {
			return Retry{}, fmt.Errorf("decode retry metadata: %w", err)
		}
	}
	return r, nil
}

// GetRetry reads an event's retry row.
func GetRetry(ctx context.Context, db DB, eventID string) (Retry, error) {
	return pgrows.One(ctx, db, "get event ingress retry", scanRetry, `SELECT `+retryColumns+` FROM event_ingress_retries WHERE event_id = $1`, eventID)
}

// Deferral is one rejection by the gate.
type Deferral struct {
	EventID string
	Source  string
	Attempt int
	Reason  string
	Detail  string
	// Class is the error class published with the failed event.
	Class   string
	RetryAt time.Time // zero: no hint
}

// RecordDeferral upserts the event's retry row for a rejected attempt:
// state scheduled, attempts = d.Attempt, the reason as last error, and the
// hint as next attempt until the scheduler confirms its own time. The
// metadata keeps what the reconciler needs to publish the same failed
// event again.
func RecordDeferral(ctx context.Context, db DB, d Deferral) error {
	md := map[string]any{"reason": d.Reason, "class": d.Class}
	var next *time.Time
	if !d.RetryAt.IsZero() {
		t := d.RetryAt.UTC()
		next = &t
		md["retry_after"] = t.Format(time.RFC3339Nano)
	}
	mdJSON, err := json.Marshal(pgtext.CleanMap(md))
	if err != nil {
		return fmt.Errorf("encode retry metadata: %w", err)
	}
	lastError := d.Reason
	if d.Detail != "" {
		lastError += ": " + d.Detail
	}
	lastError = pgtext.Clean(lastError)
	_, err = db.Exec(ctx, `
		INSERT INTO event_ingress_retries (event_id, source, retry_state, attempts, next_attempt_at, last_error, metadata)
		VALUES ($1, $2, 'scheduled', $3, $4, $5, $6)
		ON CONFLICT (event_id) DO UPDATE SET
			retry_state = 'scheduled',
			attempts = EXCLUDED.attempts,
			next_attempt_at = EXCLUDED.next_attempt_at,
			last_error = EXCLUDED.last_error,
			metadata = (event_ingress_retries.metadata - 'retry_after') || EXCLUDED.metadata,
			updated_at = now()`,
		d.EventID, d.Source, d.Attempt, next, lastError, string(mdJSON))
	if err != nil {
		return fmt.Errorf("record deferral: %w", err)
	}
	return nil
}

// ConfirmScheduled applies the scheduler's scheduled/rescheduled event for
// attempt: the deferral's next attempt time and the decision behind it. Stale
// confirmations (an attempt already evaluated, an older confirmation, a
// resolved deferral) change nothing; applied says whether this one did.
func ConfirmScheduled(ctx context.Context, db DB, eventID string, attempt int, next time.Time, decision map[string]any) (applied bool, err error) {
	return schedule(ctx, db, "confirm scheduled retry", `metadata`, `
		  AND retry_state IN ('scheduled', 'due')
		  AND $2 >= scheduled_attempt`,
		eventID, attempt, next, decision)
}

// ReopenRetry applies the scheduler's confirmation of a new attempt to a
// deferral that had ended (exhausted or cancelled): an operator's manual
// retry. The row is scheduled again for attempt and forgets the
// cancellation; a confirmation no newer than what the row knows (a
// replay) changes nothing. reopened says whether this one did. The caller
// moves the event back to deferred.
func ReopenRetry(ctx context.Context, db DB, eventID string, attempt int, next time.Time, decision map[string]any) (reopened bool, err error) {
	return schedule(ctx, db, "reopen retry", `(metadata - 'cancelled_by' - 'cancel_reason' - 'cancel_published')`, `
		  AND retry_state IN ('exhausted', 'cancelled')
		  AND $2 > scheduled_attempt`,
		eventID, attempt, next, decision)
}

// schedule schedules eventID's deferral for attempt ($2, one the gate has
// not evaluated yet) at next, with the decision merged into kept, what it
// keeps of its metadata, and reports whether it changed the row. guard
// says which rows it applies to.
func schedule(ctx context.Context, db DB, what, kept, guard, eventID string, attempt int, next time.Time, decision map[string]any) (bool, error) {
	md, err := json.Marshal(pgtext.CleanMap(decision))
	if err != nil {
		return false, fmt.Errorf("%s: encode decision: %w", what, err)
	}
	return pgrows.Changed(ctx, db, what, `
		UPDATE event_ingress_retries
		SET retry_state = 'scheduled',
		    scheduled_attempt = $2,
		    next_attempt_at = $3,
		    metadata = `+kept+` || $4::jsonb,
		    updated_at = now()
		WHERE event_id = $1
		  AND $2 > attempts`+guard,
		eventID, attempt, next.UTC(), string(md))
}

// CompleteRetry marks a deferral admitted at attempt.
func CompleteRetry(ctx context.Context, db DB, eventID string, attempt int) error {
	_, err := db.Exec(ctx, `
		UPDATE event_ingress_retries
		SET retry_state = 'completed', attempts = $2, next_attempt_at = NULL, updated_at = now()
		WHERE event_id = $1`, eventID, attempt)
	if err != nil {
		return fmt.Errorf("complete retry: %w", err)
	}
	return nil
}

// ResolveRetry ends a deferral that was not admitted: state cancelled or
// exhausted, with the reason as last error when given. A deferral already
// resolved keeps its state; applied says whether this one changed it.
func ResolveRetry(ctx context.Context, db DB, eventID string, state RetryState, lastError string) (applied bool, err error) {
	if state != RetryCancelled && state != RetryExhausted {
		return false, fmt.Errorf("resolve retry: state %q is not cancelled or exhausted", state)
	}
	return pgrows.Changed(ctx, db, "resolve retry", `
		UPDATE event_ingress_retries
		SET retry_state = $2,
		    next_attempt_at = NULL,
		    last_error = CASE WHEN $3 = '' THEN last_error ELSE $3 END,
		    updated_at = now()
		WHERE event_id = $1 AND retry_state NOT IN ('completed', 'cancelled', 'exhausted')`,
		eventID, string(state), pgtext.Clean(lastError))
}

// Unconfirmed locks up to limit deferrals the scheduler has not confirmed
// and that have not changed for olderThan (their failed event may have been
// lost with RETRIES), skipping rows other instances hold. Call it inside a
// transaction and Touch what you republish.
func Unconfirmed(ctx context.Context, db DB, olderThan time.Duration, limit int) ([]Retry, error) {
	return pgrows.All(ctx, db, "find unconfirmed retries", scanRetry, `
		SELECT `+retryColumns+` FROM event_ingress_retries
		WHERE retry_state = 'scheduled' AND scheduled_attempt <= attempts
		  AND updated_at < now() - $1 * interval '1 millisecond'
		ORDER BY updated_at
		LIMIT $2
		FOR UPDATE SKIP LOCKED`, olderThan.Milliseconds(), limit)
}

// Touch bumps a retry row's updated_at, postponing its next
// reconciliation.
func Touch(ctx context.Context, db DB, eventID string) error {
	if _, err := db.Exec(ctx, `UPDATE event_ingress_retries SET updated_at = now() WHERE event_id = $1`, eventID); err != nil {
		return fmt.Errorf("touch retry: %w", err)
	}
	return nil
}

// MergeRetryMetadata adds keys to a retry row's metadata.
func MergeRetryMetadata(ctx context.Context, db DB, eventID string, md map[string]any) error {
	b, err := json.Marshal(pgtext.CleanMap(md))
	if err != nil {
		return fmt.Errorf("encode retry metadata: %w", err)
	}
	if _, err := db.Exec(ctx, `UPDATE event_ingress_retries SET metadata = metadata || $2::jsonb, updated_at = now() WHERE event_id = $1`, eventID, string(b)); err != nil {
		return fmt.Errorf("merge retry metadata: %w", err)
	}
	return nil
}
