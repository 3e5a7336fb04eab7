package ingressstore

import (
	"context"
	"encoding/json"
	"fmt"
	"time"

	"github.com/jackc/pgx/v5"

	"github.com/retryd/retryd/internal/pgrows"
)

// Status of a workflow event.
type Status string

const (
	// StatusReceived is an event stored but not yet evaluated; it is only
	// visible inside the gate's transaction.
	StatusReceived Status = "received"
	// StatusAdmitted is an event published to events.<source>.<type>.
	StatusAdmitted Status = "admitted"
	// StatusDeferred is an event held back by its source's gate, waiting
	// for a retry.
	StatusDeferred Status = "deferred"
	// StatusCancelled is a deferral an operator cancelled: never admitted.
	StatusCancelled Status = "cancelled"
	// StatusExhausted is a deferral the scheduler gave up on.
	StatusExhausted Status = "exhausted"
)

// Event is a row of workflow_events.
type Event struct {
	ID         string
	Source     string
	Type       string
	Status     Status
	Envelope   json.RawMessage
	ReceivedAt time.Time
	AdmittedAt *time.Time
	UpdatedAt  time.Time
}

const eventColumns = `event_id, source, type, status, envelope, received_at, admitted_at, updated_at`

func scanEvent(row pgx.Row) (Event, error) {
	var ev Event
	var status string
	var env []byte
	if err := row.Scan(&ev.ID, &ev.Source, &ev.Type, &status, &env, &ev.ReceivedAt, &ev.AdmittedAt, &ev.UpdatedAt); err != nil {
		return Event{}, err
	}
	ev.Status = Status(status)
	ev.Envelope = env
	return ev, nil
}

// InsertEvent stores an event with status received. An event id is stored
// once: inserted is false when the id already exists, and the stored row
// is left as it was. ingestSeq is the event's INGEST stream sequence (0:
// unknown), the arrival order a release line follows.
func InsertEvent(ctx context.Context, db DB, id, source, typ string, envelope []byte, ingestSeq uint64) (inserted bool, err error) {
	var seq *int64
	if ingestSeq > 0 {
		v := int64(ingestSeq)
		seq = &v
	}
	return pgrows.Changed(ctx, db, "insert workflow event", `
		INSERT INTO workflow_events (event_id, source, type, status, envelope, ingest_seq)
		VALUES ($1, $2, $3, 'received', $4, $5)
		ON CONFLICT (event_id) DO NOTHING`, id, source, typ, string(envelope), seq)
}

// GetEvent reads an event.
func GetEvent(ctx context.Context, db DB, id string) (Event, error) {
	return pgrows.One(ctx, db, "get workflow event", scanEvent, `SELECT `+eventColumns+` FROM workflow_events WHERE event_id = $1`, id)
}

// LockEvent reads an event and locks its row until the transaction ends,
// so the gate, the retry consumer and the cancel API see one another's
// decisions.
func LockEvent(ctx context.Context, db DB, id string) (Event, error) {
	return pgrows.One(ctx, db, "lock workflow event", scanEvent, `SELECT `+eventColumns+` FROM workflow_events WHERE event_id = $1 FOR UPDATE`, id)
}

// SetEventStatus moves an event to status. Admitted also sets admitted_at
// (to the transaction's start). Only events currently in one of from
// change; changed says whether this one did.
func SetEventStatus(ctx context.Context, db DB, id string, status Status, from ...Status) (changed bool, err error) {
	return setEventStatus(ctx, db, id, status, nil, from...)
}

// AdmitEventAt is SetEventStatus to admitted with admitted_at = at: the
// time the gate decided, by which it counted the admission in its rate
// window. now() is the start of the gate's transaction, which decides a
// batch of a source's events and may have begun a window earlier, so
// admitted_at would not tell which window an admission counts in. A zero
// at (a source with no gate row, so no window) keeps now().
func AdmitEventAt(ctx context.Context, db DB, id string, at time.Time, from ...Status) (changed bool, err error) {
	if at.IsZero() {
		return setEventStatus(ctx, db, id, StatusAdmitted, nil, from...)
	}
	return setEventStatus(ctx, db, id, StatusAdmitted, &at, from...)
}

func setEventStatus(ctx context.Context, db DB, id string, status Status, admittedAt *time.Time, from ...Status) (changed bool, err error) {
	froms := make([]string, len(from))
	for i, f := range from {
		froms[i] = string(f)
	}
	// An event that leaves deferred no longer holds a gate slot.
	var n int
	err = db.QueryRow(ctx, `
		WITH moved AS (
			UPDATE workflow_events
			SET status = $2,
			    admitted_at = CASE WHEN $2 = 'admitted' THEN coalesce($4::timestamptz, now()) ELSE admitted_at END,
			    updated_at = now()
			WHERE event_id = $1 AND (cardinality($3::text[]) = 0 OR status = ANY($3::text[]))
			RETURNING event_id
		), hold AS (
			DELETE FROM event_source_holds WHERE event_id IN (SELECT event_id FROM moved) AND $2 <> 'deferred'
		)
		SELECT count(*) FROM moved`,
		id, string(status), froms, admittedAt).Scan(&n)
	if err != nil {
		return false, fmt.Errorf("set workflow event status: %w", err)
	}
	return n == 1, nil
}
