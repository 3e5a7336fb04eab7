package triggerstore

import (
	"context"
	"encoding/json"
	"fmt"
	"time"
)

// KeepEvent stores the envelope of an event triggers holds a delivery
// for, once: a due whose payload lacks the event, or a held fact the
// reconcile pass publishes again, reads it back with GetEvent.
func KeepEvent(ctx context.Context, db DB, id string, envelope json.RawMessage) error {
	if _, err := db.Exec(ctx, `INSERT INTO trigger_events (event_id, envelope) VALUES ($1, $2)
		ON CONFLICT (event_id) DO NOTHING`, id, string(envelope)); err != nil {
		return fmt.Errorf("keep trigger event: %w", err)
	}
	return nil
}

// GetEvent returns the envelope KeepEvent stored for event id, or
// pgdb.ErrNotFound.
func GetEvent(ctx context.Context, db DB, id string) (json.RawMessage, error) {
	var env []byte
	if err := db.QueryRow(ctx, `SELECT envelope FROM trigger_events WHERE event_id = $1`, id).Scan(&env); err != nil {
		return nil, fmt.Errorf("get trigger event: %w", notFound(err))
	}
	return env, nil
}

// PruneEvents deletes the stored events none of whose deliveries is held
// or may be retried by hand (exhausted, cancelled) any more, once they are
// older than keep (a delivery being held for the event in a transaction
// not yet committed keeps its row that long).
func PruneEvents(ctx context.Context, db DB, keep time.Duration) (int64, error) {
	tag, err := db.Exec(ctx, `DELETE FROM trigger_events e
		WHERE e.stored_at < now() - $1 * interval '1 millisecond'
		  AND NOT EXISTS (SELECT 1 FROM workflow_trigger_deliveries d
		                  WHERE d.event_id = e.event_id AND d.status IN ('throttled', 'concurrency_limited', 'exhausted', 'cancelled'))`, keep.Milliseconds())
	if err != nil {
		return 0, fmt.Errorf("prune trigger events: %w", err)
	}
	return tag.RowsAffected(), nil
}
