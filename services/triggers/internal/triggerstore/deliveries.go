package triggerstore

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"time"

	"github.com/jackc/pgx/v5"

	"github.com/retryd/retryd/internal/pgrows"
	"github.com/retryd/retryd/stores/pgdb"
	"github.com/retryd/retryd/stores/pgtext"
)

// Status is where a delivery stands.
type Status string

const (
	// StatusLaunched: the delivery requested its run (run_id is set).
	StatusLaunched Status = "launched"
	// StatusFiltered: the predicate said no (or could not be evaluated).
	StatusFiltered Status = "filtered"
	// StatusThrottled: held back by the trigger's throttle, waiting for a
	// retry.
	StatusThrottled Status = "throttled"
	// StatusConcurrencyLimited: held back by max concurrency, waiting for a
	// retry.
	StatusConcurrencyLimited Status = "concurrency_limited"
	// StatusCancelled: a held delivery given up because its trigger was
	// deleted or disabled, its event is gone, or an operator cancelled it.
	StatusCancelled Status = "cancelled"
	// StatusExhausted: the scheduler ran out of retries for it.
	StatusExhausted Status = "exhausted"
)

// Held reports whether a delivery waits for a retry.
func (s Status) Held() bool { return s == StatusThrottled || s == StatusConcurrencyLimited }

// RetryState mirrors the scheduler's view of a delivery's retry.
type RetryState string

const (
	RetryNone      RetryState = "none"
	RetryScheduled RetryState = "scheduled"
	RetryDue       RetryState = "due"
	RetryCompleted RetryState = "completed"
	RetryCancelled RetryState = "cancelled"
	RetryExhausted RetryState = "exhausted"
)

// Delivery is a row of workflow_trigger_deliveries: one event offered to
// one trigger.
type Delivery struct {
	ID             string
	TriggerID      string
	TriggerVersion int
	EventID        string
	Source         string
	EventType      string
	ThrottleKey    string
	Status         Status
	// StatusReason says what decided the status, e.g. trigger_throttled,
	// max_concurrency, predicate_false, trigger_deleted.
	StatusReason string
	RunID        string
	RetryState   RetryState
	// NextAttemptAt is when the scheduler will bring the delivery back.
	NextAttemptAt *time.Time
	// RetryAttempts is the number of the last attempt that was held back
	// (1 after the first throttle); the next due carries RetryAttempts+1.
	RetryAttempts int
	// ScheduledAttempt is the last attempt the scheduler confirmed with a
	// scheduled or rescheduled event.
	ScheduledAttempt int
	RetryMetadata    map[string]any
	CreatedAt        time.Time
	UpdatedAt        time.Time
	LaunchedAt       *time.Time
}

const deliveryColumns = `delivery_id, trigger_id, trigger_version, event_id, source, event_type,
	throttle_key, status, status_reason, coalesce(run_id, ''), retry_state, next_attempt_at,
	retry_attempts, scheduled_attempt, retry_metadata, created_at, updated_at, launched_at`

func scanDelivery(row pgx.Row) (Delivery, error) {
	var d Delivery
	var status, retryState string
	var meta []byte
	err := row.Scan(&d.ID, &d.TriggerID, &d.TriggerVersion, &d.EventID, &d.Source, &d.EventType,
		&d.ThrottleKey, &status, &d.StatusReason, &d.RunID, &retryState, &d.NextAttemptAt,
		&d.RetryAttempts, &d.ScheduledAttempt, &meta, &d.CreatedAt, &d.UpdatedAt, &d.LaunchedAt)
	if err != nil {
		return Delivery{}, err
	}
	d.Status, d.RetryState = Status(status), RetryState(retryState)
	if len(meta) > 0 {
		if err := json.Unmarshal(meta, &d.RetryMetadata); err != nil {
			return Delivery{}, fmt.Errorf("decode retry_metadata: %w", err)
		}
	}
	return d, nil
}

// metadataJSON encodes retry_metadata. Its values come from lifecycle
// events (who cancelled, why, which policy) and may hold text jsonb
// refuses.
func metadataJSON(m map[string]any) ([]byte, error) {
	if m == nil {
		return []byte("{}"), nil
	}
	b, err := json.Marshal(pgtext.CleanMap(m))
	if err != nil {
		return nil, fmt.Errorf("marshal retry_metadata: %w", err)
	}
	return b, nil
}

func nullString(s string) any {
	if s == "" {
		return nil
	}
	return s
}

// InsertDelivery stores a delivery with its outcome. A delivery is stored
// once per (event, trigger): inserted is false when it exists, and the
// stored row is left as it was.
func InsertDelivery(ctx context.Context, db DB, d Delivery) (inserted bool, err error) {
	meta, err := metadataJSON(d.RetryMetadata)
	if err != nil {
		return false, err
	}
	return pgrows.Changed(ctx, db, "insert delivery", `
		INSERT INTO workflow_trigger_deliveries (delivery_id, trigger_id, trigger_version, event_id,
			source, event_type, throttle_key, status, status_reason, run_id, retry_state,
			next_attempt_at, retry_attempts, retry_metadata, launched_at)
		VALUES ($1, $2, $3, $4, $5, $6, $7, $8, $9, $10, $11, $12, $13, $14, $15)
		ON CONFLICT DO NOTHING`,
		d.ID, d.TriggerID, d.TriggerVersion, d.EventID, d.Source, d.EventType, pgtext.Clean(d.ThrottleKey),
		string(d.Status), pgtext.Clean(d.StatusReason), nullString(d.RunID), string(d.RetryState), d.NextAttemptAt,
		d.RetryAttempts, meta, d.LaunchedAt)
}

// GetDelivery reads a delivery.
func GetDelivery(ctx context.Context, db DB, id string) (Delivery, error) {
	return pgrows.One(ctx, db, "get delivery", scanDelivery,
		`SELECT `+deliveryColumns+` FROM workflow_trigger_deliveries WHERE delivery_id = $1`, id)
}

// LockDelivery reads a delivery and locks its row until the transaction
// ends. Take the trigger's lock first (LockTrigger): every path locks
// trigger, then delivery.
func LockDelivery(ctx context.Context, db DB, id string) (Delivery, error) {
	return pgrows.One(ctx, db, "lock delivery", scanDelivery,
		`SELECT `+deliveryColumns+` FROM workflow_trigger_deliveries WHERE delivery_id = $1 FOR UPDATE`, id)
}

// SaveOutcome writes the result of a retry attempt: status, reason, the
// trigger version evaluated, the run, and the retry columns (retry_metadata
// is replaced).
func SaveOutcome(ctx context.Context, db DB, d Delivery) error {
	meta, err := metadataJSON(d.RetryMetadata)
	if err != nil {
		return err
	}
	tag, err := db.Exec(ctx, `
		UPDATE workflow_trigger_deliveries
		SET status = $2, status_reason = $3, trigger_version = $4, throttle_key = $5,
		    run_id = $6, launched_at = $7, retry_state = $8, next_attempt_at = $9,
		    retry_attempts = $10, retry_metadata = $11, updated_at = now()
		WHERE delivery_id = $1`,
		d.ID, string(d.Status), pgtext.Clean(d.StatusReason), d.TriggerVersion, pgtext.Clean(d.ThrottleKey),
		nullString(d.RunID), d.LaunchedAt, string(d.RetryState), d.NextAttemptAt,
		d.RetryAttempts, meta)
	if err != nil {
		return fmt.Errorf("save delivery outcome: %w", err)
	}
	if tag.RowsAffected() != 1 {
		return fmt.Errorf("save delivery outcome: %w", pgdb.ErrNotFound)
	}
	return nil
}

// NthRecentLaunch returns the launch time of the n-th most recent delivery
// of a trigger and throttle key launched after since, leaving out the
// delivery excludeID. ok is false when fewer than n launched: with n the
// throttle limit and since the start of the sliding window, ok means the
// window is full and at+window is when a slot frees up.
//
// Only launched deliveries count. A delivery's own earlier throttled or
// concurrency-limited record never counts against it (otherwise a held
// delivery would use up its own window), and excludeID makes that explicit
// for the delivery being retried.
func NthRecentLaunch(ctx context.Context, db DB, triggerID, key string, since time.Time, n int, excludeID string) (at time.Time, ok bool, err error) {
	err = db.QueryRow(ctx, `
		SELECT launched_at FROM workflow_trigger_deliveries
		WHERE trigger_id = $1 AND throttle_key = $2 AND status = 'launched'
		  AND launched_at > $3 AND delivery_id <> $4
		ORDER BY launched_at DESC
		OFFSET $5 LIMIT 1`, triggerID, key, since, excludeID, n-1).Scan(&at)
	if err != nil {
		if errors.Is(err, pgx.ErrNoRows) {
			return time.Time{}, false, nil
		}
		return time.Time{}, false, fmt.Errorf("count recent launches: %w", err)
	}
	return at, true, nil
}

// ApplyScheduled records the scheduler's scheduled or rescheduled event
// for attempt (the attempt that runs when due). Held deliveries change when
// the event is not older than what they know. Exhausted, cancelled or
// filtered ones change only for an operator's manual retry (manual) of an
// attempt beyond the last one scheduled: a replayed event, or the late
// confirmation of the attempt that was pending when the delivery was
// cancelled, never reopens them. Launched deliveries never change.
func ApplyScheduled(ctx context.Context, db DB, id string, attempt int, next time.Time, manual bool, meta map[string]any) (applied bool, err error) {
	m, err := metadataJSON(meta)
	if err != nil {
		return false, err
	}
	return pgrows.Changed(ctx, db, "apply scheduled", `
		UPDATE workflow_trigger_deliveries
		SET retry_state = 'scheduled', next_attempt_at = $3,
		    retry_attempts = GREATEST(retry_attempts, $2 - 1),
		    scheduled_attempt = GREATEST(scheduled_attempt, $2),
		    retry_metadata = retry_metadata || $4::jsonb, updated_at = now()
		WHERE delivery_id = $1 AND retry_attempts <= $2 - 1
		  AND ((status IN ('throttled', 'concurrency_limited') AND scheduled_attempt <= $2)
		       OR ($5 AND status IN ('exhausted', 'cancelled', 'filtered') AND scheduled_attempt < $2))`, id, attempt, next, m, manual)
}

// ApplyExhausted records that the scheduler gave up on a held delivery
// after attempt, for reason (max_retries, ...). It returns the delivery as
// it is now.
func ApplyExhausted(ctx context.Context, db DB, id string, attempt int, reason string, meta map[string]any) (d Delivery, applied bool, err error) {
	return applyTerminal(ctx, db, id, attempt, StatusExhausted, RetryExhausted, reason, meta, `
		  AND status IN ('throttled', 'concurrency_limited')
		  AND retry_attempts <= $2`)
}

// ApplyCancelled records that a delivery's retry was cancelled (by an
// operator, or by the service itself when the trigger went away). A
// launched or filtered delivery keeps its status; attempt 0 means "any
// attempt".
func ApplyCancelled(ctx context.Context, db DB, id string, attempt int, reason string, meta map[string]any) (d Delivery, applied bool, err error) {
	return applyTerminal(ctx, db, id, attempt, StatusCancelled, RetryCancelled, reason, meta, `
		  AND status IN ('throttled', 'concurrency_limited', 'exhausted')
		  AND ($2 = 0 OR retry_attempts <= $2)`)
}

func applyTerminal(ctx context.Context, db DB, id string, attempt int, status Status, state RetryState, reason string, meta map[string]any, guard string) (Delivery, bool, error) {
	m, err := metadataJSON(meta)
	if err != nil {
		return Delivery{}, false, err
	}
	d, err := scanDelivery(db.QueryRow(ctx, `
		UPDATE workflow_trigger_deliveries
		SET status = $3, retry_state = $4, status_reason = $6, next_attempt_at = NULL,
		    retry_metadata = retry_metadata || $5::jsonb, updated_at = now()
		WHERE delivery_id = $1`+guard+`
		RETURNING `+deliveryColumns, id, attempt, string(status), string(state), m, pgtext.Clean(reason)))
	return updatedOrCurrent(d, err, "apply "+string(state), func() (Delivery, error) { return GetDelivery(ctx, db, id) })
}

// ListDeliveriesOptions filters and pages ListDeliveries. Before is the
// last delivery id of the previous page.
type ListDeliveriesOptions struct {
	TriggerID string
	Status    Status
	Before    string
	Limit     int
}

// ListDeliveries lists a trigger's deliveries, newest first.
func ListDeliveries(ctx context.Context, db DB, o ListDeliveriesOptions) ([]Delivery, error) {
	return pgrows.All(ctx, db, "list deliveries", scanDelivery, `
		SELECT `+deliveryColumns+` FROM workflow_trigger_deliveries d
		WHERE trigger_id = $1
		  AND ($2 = '' OR status = $2)
		  AND ($3 = '' OR (created_at, delivery_id) < (
		        SELECT created_at, delivery_id FROM workflow_trigger_deliveries WHERE delivery_id = $3))
		ORDER BY created_at DESC, delivery_id DESC
		LIMIT $4`, o.TriggerID, string(o.Status), o.Before, pageSize(o.Limit))
}

// Unconfirmed lists held deliveries whose last failed attempt the
// scheduler has not confirmed (no scheduled/rescheduled event for the next
// attempt) since before olderThan: their failed event may never have
// reached the scheduler.
func Unconfirmed(ctx context.Context, db DB, olderThan time.Time, limit int) ([]Delivery, error) {
	return pgrows.All(ctx, db, "list unconfirmed deliveries", scanDelivery, `
		SELECT `+deliveryColumns+` FROM workflow_trigger_deliveries
		WHERE retry_state = 'scheduled' AND scheduled_attempt <= retry_attempts
		  AND status IN ('throttled', 'concurrency_limited') AND updated_at < $1
		ORDER BY updated_at
		LIMIT $2`, olderThan, limit)
}

// CountByStatus counts a trigger's deliveries per status.
func CountByStatus(ctx context.Context, db DB, triggerID string) (map[Status]int, error) {
	rows, err := db.Query(ctx, `
		SELECT status, count(*) FROM workflow_trigger_deliveries
		WHERE trigger_id = $1 GROUP BY status`, triggerID)
	if err != nil {
		return nil, fmt.Errorf("count deliveries: %w", err)
	}
	out := map[Status]int{}
	var s string
	var n int
	if _, err := pgx.ForEachRow(rows, []any{&s, &n}, func() error {
		out[Status(s)] = n
		return nil
	}); err != nil {
		return nil, fmt.Errorf("count deliveries: %w", err)
	}
	return out, nil
}

// TouchDelivery sets a delivery's updated_at to now, e.g. after its failed
// event was published again, so the next reconcile pass waits again.
func TouchDelivery(ctx context.Context, db DB, id string) error {
	if _, err := db.Exec(ctx, `UPDATE workflow_trigger_deliveries SET updated_at = now() WHERE delivery_id = $1`, id); err != nil {
		return fmt.Errorf("touch delivery: %w", err)
	}
	return nil
}

// ThrottleLineGrace is how long a throttled delivery whose slot has passed
// still counts as waiting in line: its due is on its way or being
// evaluated. A delivery stuck longer (the scheduler is down) no longer
// holds the line up.
const ThrottleLineGrace = time.Minute

// ThrottleSlot is the slot the next delivery in the throttle line of a
// trigger and key gets at now, with a sliding window of limit launches:
// the launches of the window and the slots already given out form one
// sequence, and the next slot is when the limit-th latest of them leaves
// the window, after the last slot given out (arrival order) and not
// before now. waiting reports whether deliveries still wait for their
// slots: a fresh delivery then queues behind them even when the window
// has room. The delivery excludeID (the one deciding) is left out.
// The caller holds the trigger's lock (LockTrigger), so slots are given
// out one at a time.
func ThrottleSlot(ctx context.Context, db DB, triggerID, key string, now time.Time, window time.Duration, limit int, excludeID string) (slot time.Time, waiting bool, err error) {
	var limitTh, last *time.Time
	err = db.QueryRow(ctx, `
		WITH seq AS (
			(SELECT launched_at AS at, false AS planned FROM workflow_trigger_deliveries
			 WHERE trigger_id = $1 AND throttle_key = $2 AND status = 'launched'
			   AND launched_at > $3 AND delivery_id <> $6
			 ORDER BY launched_at DESC LIMIT $5)
			UNION ALL
			(SELECT next_attempt_at, true FROM workflow_trigger_deliveries
			 WHERE trigger_id = $1 AND throttle_key = $2 AND status = 'throttled'
			   AND next_attempt_at > $4 AND delivery_id <> $6
			 ORDER BY next_attempt_at DESC LIMIT $5)
		)
		SELECT (SELECT at FROM seq ORDER BY at DESC OFFSET $5 - 1 LIMIT 1),
		       (SELECT max(at) FROM seq WHERE planned)`,
		triggerID, key, now.Add(-window), now.Add(-ThrottleLineGrace), limit, excludeID).Scan(&limitTh, &last)
	if err != nil {
		return time.Time{}, false, fmt.Errorf("read throttle line: %w", err)
	}
	slot = now
	if limitTh != nil && limitTh.Add(window).After(slot) {
		slot = limitTh.Add(window)
	}
	// Strictly after the last slot given out (a microsecond, the
	// database's resolution), so that the line has one order even when
	// the window lets several go at the same moment.
	if last != nil && !slot.After(*last) {
		slot = last.Add(time.Microsecond)
	}
	return slot.UTC().Truncate(time.Microsecond), last != nil, nil
}

// ThrottleHoldersAhead counts the throttled deliveries of a trigger and key
// whose slot comes before delivery id's and came in (since, now]: the
// ones waiting for their turn ahead of it.
func ThrottleHoldersAhead(ctx context.Context, db DB, triggerID, key, id string, since, now time.Time) (int, error) {
	var n int
	err := db.QueryRow(ctx, `
		SELECT count(*) FROM workflow_trigger_deliveries d
		WHERE d.trigger_id = $1 AND d.throttle_key = $2 AND d.status = 'throttled' AND d.delivery_id <> $3
		  AND d.next_attempt_at > $4 AND d.next_attempt_at <= $5
		  AND d.next_attempt_at < (SELECT next_attempt_at FROM workflow_trigger_deliveries WHERE delivery_id = $3)`,
		triggerID, key, id, since, now).Scan(&n)
	if err != nil {
		return 0, fmt.Errorf("count throttle holders ahead: %w", err)
	}
	return n, nil
}
