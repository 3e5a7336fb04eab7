package retrystore

import (
	"context"
	"encoding/json"
	"fmt"
	"strings"
	"time"

	"github.com/jackc/pgx/v5"

	"github.com/retryd/retryd/internal/pgrows"
)

// State is the state of a retry row.
type State string

// States of a retry. Scheduled and due are pending; the others are
// terminal until an operator retries the item by hand.
const (
	// StateScheduled waits for NextAttemptAt.
	StateScheduled State = "scheduled"
	// StateDue had its due event published; the owner runs the attempt and
	// reports failed or succeeded.
	StateDue State = "due"
	// StateSucceeded: an attempt worked.
	StateSucceeded State = "succeeded"
	// StateExhausted: no retry left (max retries, non-retryable class or
	// retries disabled); the dead-letter state.
	StateExhausted State = "exhausted"
	// StateCancelled: an operator or the owner cancelled the item.
	StateCancelled State = "cancelled"
)

// States lists every state.
var States = []State{StateScheduled, StateDue, StateSucceeded, StateExhausted, StateCancelled}

// Valid reports whether s is a known state.
func (s State) Valid() bool {
	for _, v := range States {
		if v == s {
			return true
		}
	}
	return false
}

// Terminal reports whether s is a final state (succeeded, exhausted,
// cancelled).
func (s State) Terminal() bool {
	return s == StateSucceeded || s == StateExhausted || s == StateCancelled
}

// Retry is one row of the retries table.
type Retry struct {
	Kind   string `json:"kind"`
	ItemID string `json:"id"`
	State  State  `json:"state"`
	// Attempt is the attempt that runs next (scheduled, due) or that ran
	// last (terminal states).
	Attempt int `json:"attempt"`
	// RetryCount is the number of retries used against MaxRetries:
	// Attempt - 1 - BudgetBase while pending.
	RetryCount int `json:"retry_count"`
	// BudgetBase is raised by a manual retry that resets the budget, so
	// attempts keep growing (and due ids stay unique).
	BudgetBase         int  `json:"budget_base"`
	MaxRetries         int  `json:"max_retries"`
	RetryEnabled       bool `json:"retry_enabled"`
	MaxRetriesOverride *int `json:"max_retries_override,omitempty"`
	// TimeoutMS is the job's own timeout (migration 00104), given back on
	// its due with MaxRetriesOverride and RetryEnabled.
	TimeoutMS *int64 `json:"timeout_ms,omitempty"`
	// Priority is a job's priority band (migration 00108), given back on
	// its due: empty when the job had none (normal).
	Priority         string            `json:"priority,omitempty"`
	JobType          string            `json:"job_type,omitempty"`
	Source           string            `json:"source,omitempty"`
	PolicyName       string            `json:"policy_name"`
	PolicyVersion    int               `json:"policy_version"`
	NextAttemptAt    *time.Time        `json:"next_attempt_at,omitempty"`
	DueAt            *time.Time        `json:"due_at,omitempty"`
	DueEmissions     int               `json:"due_emissions"`
	LastErrorClass   string            `json:"last_error_class,omitempty"`
	LastErrorMessage string            `json:"last_error_message,omitempty"`
	LastErrorAt      *time.Time        `json:"last_error_at,omitempty"`
	LastReason       string            `json:"last_reason,omitempty"`
	ExhaustedReason  string            `json:"exhausted_reason,omitempty"`
	Payload          json.RawMessage   `json:"payload,omitempty"`
	Checkpoint       json.RawMessage   `json:"checkpoint,omitempty"`
	Metadata         map[string]string `json:"metadata,omitempty"`
	CreatedAt        time.Time         `json:"created_at"`
	UpdatedAt        time.Time         `json:"updated_at"`
	ResolvedAt       *time.Time        `json:"resolved_at,omitempty"`
	// TraceContext is the W3C traceparent of the decision that scheduled
	// the attempt; the due event continues its trace. Empty without
	// tracing.
	TraceContext string `json:"trace_context,omitempty"`
	// HeldSince is when the item's current stretch of holds began (the
	// policy's max_hold counts from it); nil when it is not held.
	// HoldReason and HoldKey are those of its last hold.
	HeldSince  *time.Time `json:"held_since,omitempty"`
	HoldReason string     `json:"hold_reason,omitempty"`
	HoldKey    string     `json:"hold_key,omitempty"`
	// HoldUntil is when the current hold ends, as far as is known (the
	// owner's until, the slot a release gave it, or max_hold where the
	// hold's time was brought forward to it); nil when only a release or
	// max_hold ends it. MaxHoldMS is the max_hold of the decision that
	// holds the item; nil when its last decision was not a hold.
	// (Migration 00111.)
	HoldUntil *time.Time `json:"hold_until,omitempty"`
	MaxHoldMS *int64     `json:"max_hold_ms,omitempty"`
	// Held is the item's current hold, for the views: derived from the
	// columns above when the row is encoded (MarshalJSON), so it is never
	// stale; read into on decoding. Go code on the server calls
	// CurrentHold.
	Held *Hold `json:"held,omitempty"`
}

// Hold is a pending item's current hold: it waits for permission (a
// throttle, a pause, a concurrency limit), not after a failure.
type Hold struct {
	Reason string    `json:"reason"`
	Key    string    `json:"key,omitempty"`
	Since  time.Time `json:"since"`
	// Until is when the hold ends, if that is known (never past
	// MaxHoldAt); nil: it lasts until released, at most until MaxHoldAt.
	Until     *time.Time `json:"until,omitempty"`
	MaxHoldMS int64      `json:"max_hold_ms"`
	// MaxHoldAt is Since plus MaxHoldMS: the item is exhausted
	// (hold_expired) if it is still held then.
	MaxHoldAt time.Time `json:"max_hold_at"`
}

// CurrentHold is r's hold while r waits on one: scheduled, held since a
// time, by a hold decision. Nil otherwise: a due item is being looked at
// by its owner, and an item whose last decision was a backoff or a manual
// retry is not held, whatever held_since still says.
func (r Retry) CurrentHold() *Hold {
	if r.State != StateScheduled || r.HeldSince == nil || r.MaxHoldMS == nil {
		return nil
	}
	h := &Hold{Reason: r.HoldReason, Key: r.HoldKey, Since: *r.HeldSince, MaxHoldMS: *r.MaxHoldMS,
		MaxHoldAt: r.HeldSince.Add(time.Duration(*r.MaxHoldMS) * time.Millisecond)}
	if r.HoldUntil != nil {
		until := *r.HoldUntil
		if until.After(h.MaxHoldAt) {
			until = h.MaxHoldAt
		}
		h.Until = &until
	}
	return h
}

// MarshalJSON writes the row with its current hold (Held) derived from
// the row as it is.
func (r Retry) MarshalJSON() ([]byte, error) {
	type plain Retry
	p := plain(r)
	p.Held = r.CurrentHold()
	return json.Marshal(p)
}

// Key identifies a retry.
type Key struct {
	Kind   string
	ItemID string
}

// Key returns the row's key.
func (r Retry) Key() Key { return Key{Kind: r.Kind, ItemID: r.ItemID} }

const retryColumns = `kind, item_id, state, attempt, retry_count, budget_base, max_retries,
	retry_enabled, max_retries_override, job_type, source, policy_name, policy_version,
	next_attempt_at, due_at, due_emissions, last_error_class, last_error_message, last_error_at,
	last_reason, exhausted_reason, payload, checkpoint, metadata, created_at, updated_at, resolved_at,
	trace_context, held_since, hold_reason, hold_key, timeout_ms, priority, hold_until, max_hold_ms`

// scanRetryRow is scanRetry of a row of retryColumns alone.
func scanRetryRow(row pgx.Row) (Retry, error) { return scanRetry(row) }

func scanRetry(row pgx.Row, extra ...any) (Retry, error) {
	var r Retry
	var state string
	var metadata []byte
	dest := []any{
		&r.Kind, &r.ItemID, &state, &r.Attempt, &r.RetryCount, &r.BudgetBase, &r.MaxRetries,
		&r.RetryEnabled, &r.MaxRetriesOverride, &r.JobType, &r.Source, &r.PolicyName, &r.PolicyVersion,
		&r.NextAttemptAt, &r.DueAt, &r.DueEmissions, &r.LastErrorClass, &r.LastErrorMessage, &r.LastErrorAt,
		&r.LastReason, &r.ExhaustedReason, (*[]byte)(&r.Payload), (*[]byte)(&r.Checkpoint), &metadata,
		&r.CreatedAt, &r.UpdatedAt, &r.ResolvedAt, &r.TraceContext, &r.HeldSince, &r.HoldReason, &r.HoldKey, &r.TimeoutMS,
		&r.Priority, &r.HoldUntil, &r.MaxHoldMS,
	}
	if err := row.Scan(append(dest, extra...)...); err != nil {
		return Retry{}, err
	}
	r.State = State(state)
	if len(metadata) > 0 && string(metadata) != "null" {
		if err := json.Unmarshal(metadata, &r.Metadata); err != nil {
			return Retry{}, fmt.Errorf("decode metadata of %s/%s: %w", r.Kind, r.ItemID, err)
		}
	}
	if len(r.Metadata) == 0 {
		r.Metadata = nil
	}
	return r, nil
}

// Get returns the retry kind/itemID, or pgdb.ErrNotFound.
func Get(ctx context.Context, q Querier, kind, itemID string) (Retry, error) {
	return get(ctx, q, kind, itemID, "")
}

// GetForUpdate is Get with a row lock held until the transaction ends; q
// must be a transaction.
func GetForUpdate(ctx context.Context, q Querier, kind, itemID string) (Retry, error) {
	return get(ctx, q, kind, itemID, " FOR UPDATE")
}

func get(ctx context.Context, q Querier, kind, itemID, lock string) (Retry, error) {
	return pgrows.One(ctx, q, "get retry "+kind+"/"+itemID, scanRetryRow,
		`SELECT `+retryColumns+` FROM retries WHERE kind = $1 AND item_id = $2`+lock, kind, itemID)
}

// Save inserts or updates the row with every field of r except CreatedAt
// (kept on update) and UpdatedAt (set to now()). It returns the row as
// stored.
func Save(ctx context.Context, q Querier, r Retry) (Retry, error) {
	args, err := saveArgs(r)
	if err != nil {
		return Retry{}, err
	}
	saved, err := scanRetry(q.QueryRow(ctx, saveSQL, args...))
	if err != nil {
		return Retry{}, fmt.Errorf("save retry %s/%s: %w", r.Kind, r.ItemID, err)
	}
	return saved, nil
}

// Batcher sends several statements in one round trip (a connection or a
// transaction).
type Batcher interface {
	SendBatch(ctx context.Context, b *pgx.Batch) pgx.BatchResults
}

// SaveMany saves every row as Save does, in order, in one round trip, and
// sets each row's CreatedAt and UpdatedAt as stored. A row may appear more
// than once (an item with several facts in one batch): the last save wins,
// as it would one by one.
//
// Unlike Save it does not read the whole row back: the policy stage saves
// two or three rows a cycle, and scanning 35 columns of each cost a tenth
// of the scheduler's CPU. The other fields are stored as given, but for
// Postgres' own forms (times in microseconds, jsonb normalised); read the
// row again where those matter.
func SaveMany(ctx context.Context, q Batcher, rows []*Retry) error {
	if len(rows) == 0 {
		return nil
	}
	b := &pgx.Batch{}
	for _, r := range rows {
		args, err := saveArgs(*r)
		if err != nil {
			return err
		}
		b.Queue(saveManySQL, args...)
	}
	br := q.SendBatch(ctx, b)
	for _, r := range rows {
		if err := br.QueryRow().Scan(&r.CreatedAt, &r.UpdatedAt); err != nil {
			_ = br.Close()
			return fmt.Errorf("save retry %s/%s: %w", r.Kind, r.ItemID, err)
		}
	}
	if err := br.Close(); err != nil {
		return fmt.Errorf("save retries: %w", err)
	}
	return nil
}

const saveSQL = `
INSERT INTO retries (kind, item_id, state, attempt, retry_count, budget_base, max_retries,
	retry_enabled, max_retries_override, job_type, source, policy_name, policy_version,
	next_attempt_at, due_at, due_emissions, last_error_class, last_error_message, last_error_at,
	last_reason, exhausted_reason, payload, checkpoint, metadata, resolved_at, trace_context,
	held_since, hold_reason, hold_key, timeout_ms, priority, hold_until, max_hold_ms)
VALUES ($1, $2, $3, $4, $5, $6, $7, $8, $9, $10, $11, $12, $13, $14, $15, $16, $17, $18, $19,
	$20, $21, $22, $23, $24, $25, $26, $27, $28, $29, $30, $31, $32, $33)
ON CONFLICT (kind, item_id) DO UPDATE SET
	state = EXCLUDED.state, attempt = EXCLUDED.attempt, retry_count = EXCLUDED.retry_count,
	budget_base = EXCLUDED.budget_base, max_retries = EXCLUDED.max_retries,
	retry_enabled = EXCLUDED.retry_enabled, max_retries_override = EXCLUDED.max_retries_override,
	job_type = EXCLUDED.job_type, source = EXCLUDED.source, policy_name = EXCLUDED.policy_name,
	policy_version = EXCLUDED.policy_version, next_attempt_at = EXCLUDED.next_attempt_at,
	due_at = EXCLUDED.due_at, due_emissions = EXCLUDED.due_emissions,
	last_error_class = EXCLUDED.last_error_class, last_error_message = EXCLUDED.last_error_message,
	last_error_at = EXCLUDED.last_error_at, last_reason = EXCLUDED.last_reason,
	exhausted_reason = EXCLUDED.exhausted_reason, payload = EXCLUDED.payload,
	checkpoint = EXCLUDED.checkpoint, metadata = EXCLUDED.metadata,
	resolved_at = EXCLUDED.resolved_at, trace_context = EXCLUDED.trace_context,
	held_since = EXCLUDED.held_since, hold_reason = EXCLUDED.hold_reason, hold_key = EXCLUDED.hold_key,
	timeout_ms = EXCLUDED.timeout_ms, priority = EXCLUDED.priority,
	hold_until = EXCLUDED.hold_until, max_hold_ms = EXCLUDED.max_hold_ms, updated_at = now()
RETURNING ` + retryColumns

var saveManySQL = strings.Replace(saveSQL, "RETURNING "+retryColumns, "RETURNING created_at, updated_at", 1)

func saveArgs(r Retry) ([]any, error) {
	if !r.State.Valid() {
		return nil, fmt.Errorf("save retry %s/%s: state %q is not valid", r.Kind, r.ItemID, r.State)
	}
	md := r.Metadata
	if md == nil {
		md = map[string]string{}
	}
	mdJSON, err := json.Marshal(md)
	if err != nil {
		return nil, fmt.Errorf("save retry %s/%s: encode metadata: %w", r.Kind, r.ItemID, err)
	}
	return []any{r.Kind, r.ItemID, string(r.State), r.Attempt, r.RetryCount, r.BudgetBase, r.MaxRetries,
		r.RetryEnabled, r.MaxRetriesOverride, r.JobType, r.Source, r.PolicyName, r.PolicyVersion,
		r.NextAttemptAt, r.DueAt, r.DueEmissions, r.LastErrorClass, r.LastErrorMessage, r.LastErrorAt,
		r.LastReason, r.ExhaustedReason, rawOrNil(r.Payload), rawOrNil(r.Checkpoint), mdJSON, r.ResolvedAt, r.TraceContext,
		r.HeldSince, r.HoldReason, r.HoldKey, r.TimeoutMS, r.Priority, r.HoldUntil, r.MaxHoldMS}, nil
}

// TryGetManyForUpdate reads and locks, in one statement and without
// waiting, the rows of keys that no other transaction holds (in key
// order, the order every locker uses, against deadlocks), and returns in
// busy the keys whose row exists but another transaction has locked.
// Keys without a row are in neither. The policy stage's advisory locks
// (TryLockItems) do not cover every row lock: the due loop's claims, the
// releases and the operator actions lock rows without them, and waiting
// on a peer frozen inside one (fault scenario 3) cost the lock timeout,
// batch after batch.
//
// Both halves read one snapshot (one statement): a row the first skips
// is seen by the second. A row deleted by its holder after the snapshot
// is reported busy, spuriously.
func TryGetManyForUpdate(ctx context.Context, q Querier, keys []Key) (rows map[Key]Retry, busy map[Key]bool, err error) {
	kinds, items := make([]string, len(keys)), make([]string, len(keys))
	for i, k := range keys {
		kinds[i], items[i] = k.Kind, k.ItemID
	}
	res, err := q.Query(ctx, `WITH locked AS (
	SELECT `+retryColumns+` FROM retries
	WHERE (kind, item_id) IN (SELECT * FROM unnest($1::text[], $2::text[]))
	ORDER BY kind, item_id
	FOR UPDATE SKIP LOCKED
)
SELECT `+retryColumns+`, false FROM locked
UNION ALL
SELECT `+retryColumns+`, true FROM retries r
WHERE (kind, item_id) IN (SELECT * FROM unnest($1::text[], $2::text[]))
	AND NOT EXISTS (SELECT FROM locked l WHERE l.kind = r.kind AND l.item_id = r.item_id)`, kinds, items)
	if err != nil {
		return nil, nil, fmt.Errorf("lock retries: %w", err)
	}
	defer res.Close()
	rows, busy = make(map[Key]Retry, len(keys)), map[Key]bool{}
	for res.Next() {
		var held bool
		r, err := scanRetry(res, &held)
		if err != nil {
			return nil, nil, fmt.Errorf("lock retries: %w", err)
		}
		if held {
			busy[r.Key()] = true
			continue
		}
		rows[r.Key()] = r
	}
	if err := res.Err(); err != nil {
		return nil, nil, fmt.Errorf("lock retries: %w", err)
	}
	return rows, busy, nil
}

// rawOrNil makes an empty payload a SQL NULL rather than an invalid empty
// JSON text.
func rawOrNil(b json.RawMessage) any {
	if len(b) == 0 {
		return nil
	}
	return string(b)
}

// Count returns the number of retry rows and history rows; the rebuild uses
// it to refuse a projection that is not empty.
func Count(ctx context.Context, q Querier) (retries, history int64, err error) {
	err = q.QueryRow(ctx, `SELECT (SELECT count(*) FROM retries), (SELECT count(*) FROM retry_history)`).Scan(&retries, &history)
	if err != nil {
		return 0, 0, fmt.Errorf("count retries: %w", err)
	}
	return retries, history, nil
}

// DBNow returns the database clock (transaction start time inside a
// transaction).
func DBNow(ctx context.Context, q Querier) (time.Time, error) {
	var now time.Time
	if err := q.QueryRow(ctx, `SELECT now()`).Scan(&now); err != nil {
		return time.Time{}, fmt.Errorf("read database clock: %w", err)
	}
	return now, nil
}

// TryLockItems takes a transaction-scoped advisory lock on each item
// without waiting and returns the items another transaction holds. The
// policy stage takes them before anything else, so a transaction that
// never ends (an instance frozen mid-batch) costs its peers nothing: they
// hand its items' facts back instead of waiting the lock timeout on each
// (fault scenario 3). A hash collision only hands a fact back spuriously.
func TryLockItems(ctx context.Context, q Querier, keys []Key) (busy map[Key]bool, err error) {
	kinds, items := make([]string, len(keys)), make([]string, len(keys))
	for i, k := range keys {
		kinds[i], items[i] = k.Kind, k.ItemID
	}
	rows, err := q.Query(ctx, `SELECT k, i FROM unnest($1::text[], $2::text[]) AS t(k, i)
WHERE NOT pg_try_advisory_xact_lock(hashtext(k), hashtext(i))`, kinds, items)
	if err != nil {
		return nil, fmt.Errorf("lock items: %w", err)
	}
	busy = map[Key]bool{}
	var k Key
	if _, err := pgx.ForEachRow(rows, []any{&k.Kind, &k.ItemID}, func() error {
		busy[k] = true
		return nil
	}); err != nil {
		return nil, fmt.Errorf("lock items: %w", err)
	}
	return busy, nil
}
