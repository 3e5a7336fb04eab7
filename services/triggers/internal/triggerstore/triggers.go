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
)

// Definition is the part of a trigger a user writes. Every change to it
// bumps the trigger's version and is kept in workflow_trigger_versions.
// Zero limits mean "none": ThrottleLimit 0 is no throttle, MaxConcurrency 0
// is no concurrency limit. Validation (CEL compilation, token rules) is the
// service's job; the store keeps what it is given.
type Definition struct {
	Name      string
	Source    string
	EventType string
	// Predicate is a CEL expression returning bool; empty matches every
	// event.
	Predicate      string
	ThrottleLimit  int
	ThrottleWindow time.Duration
	// ThrottleKey is a CEL expression whose value splits the throttle into
	// one budget per key; empty is one budget for the trigger.
	ThrottleKey    string
	MaxConcurrency int
	// RunTimeout is how long a run of the trigger holds its concurrency
	// slot without a heartbeat or an end; zero is the service's default.
	RunTimeout time.Duration
	Workflow   string
	Enabled    bool
}

// Trigger is a row of workflow_triggers.
type Trigger struct {
	ID string
	Definition
	Version   int
	DeletedAt *time.Time
	CreatedAt time.Time
	UpdatedAt time.Time
}

// Deleted reports whether the trigger was deleted. Deleted triggers are
// kept (deliveries and versions refer to them) but never match events.
func (t Trigger) Deleted() bool { return t.DeletedAt != nil }

// Version is one row of workflow_trigger_versions: the definition as it
// was from that version on.
type Version struct {
	TriggerID  string
	Version    int
	Definition Definition
	// Deleted marks the version written by the delete.
	Deleted   bool
	CreatedAt time.Time
}

// snapshot is the JSON kept in workflow_trigger_versions.definition.
type snapshot struct {
	Name             string `json:"name"`
	Source           string `json:"source"`
	EventType        string `json:"event_type"`
	Predicate        string `json:"predicate"`
	ThrottleLimit    int    `json:"throttle_limit,omitempty"`
	ThrottleWindowMS int64  `json:"throttle_window_ms,omitempty"`
	ThrottleKey      string `json:"throttle_key,omitempty"`
	MaxConcurrency   int    `json:"max_concurrency,omitempty"`
	RunTimeoutMS     int64  `json:"run_timeout_ms,omitempty"`
	Workflow         string `json:"workflow"`
	Enabled          bool   `json:"enabled"`
	Deleted          bool   `json:"deleted,omitempty"`
}

func toSnapshot(d Definition, deleted bool) snapshot {
	return snapshot{
		Name: d.Name, Source: d.Source, EventType: d.EventType, Predicate: d.Predicate,
		ThrottleLimit: d.ThrottleLimit, ThrottleWindowMS: d.ThrottleWindow.Milliseconds(),
		ThrottleKey: d.ThrottleKey, MaxConcurrency: d.MaxConcurrency, RunTimeoutMS: d.RunTimeout.Milliseconds(),
		Workflow: d.Workflow, Enabled: d.Enabled, Deleted: deleted,
	}
}

func (s snapshot) definition() Definition {
	return Definition{
		Name: s.Name, Source: s.Source, EventType: s.EventType, Predicate: s.Predicate,
		ThrottleLimit: s.ThrottleLimit, ThrottleWindow: time.Duration(s.ThrottleWindowMS) * time.Millisecond,
		ThrottleKey: s.ThrottleKey, MaxConcurrency: s.MaxConcurrency,
		RunTimeout: time.Duration(s.RunTimeoutMS) * time.Millisecond, Workflow: s.Workflow, Enabled: s.Enabled,
	}
}

const triggerColumns = `trigger_id, name, source, event_type, predicate, throttle_limit,
	throttle_window_ms, throttle_key, max_concurrency, run_timeout_ms, workflow, enabled, version,
	deleted_at, created_at, updated_at`

func scanTrigger(row pgx.Row) (Trigger, error) {
	var t Trigger
	var limit, maxConc *int32
	var windowMS, runTimeoutMS *int64
	err := row.Scan(&t.ID, &t.Name, &t.Source, &t.EventType, &t.Predicate, &limit,
		&windowMS, &t.ThrottleKey, &maxConc, &runTimeoutMS, &t.Workflow, &t.Enabled, &t.Version,
		&t.DeletedAt, &t.CreatedAt, &t.UpdatedAt)
	if err != nil {
		return Trigger{}, err
	}
	if limit != nil {
		t.ThrottleLimit = int(*limit)
	}
	if windowMS != nil {
		t.ThrottleWindow = time.Duration(*windowMS) * time.Millisecond
	}
	if maxConc != nil {
		t.MaxConcurrency = int(*maxConc)
	}
	if runTimeoutMS != nil {
		t.RunTimeout = time.Duration(*runTimeoutMS) * time.Millisecond
	}
	return t, nil
}

// nullable maps the "none" zero values to SQL NULL, which the table's
// CHECK constraints expect.
func nullable(d Definition) (limit, windowMS, maxConc, runTimeoutMS any) {
	if d.ThrottleLimit > 0 {
		limit = d.ThrottleLimit
	}
	if d.ThrottleWindow > 0 {
		windowMS = d.ThrottleWindow.Milliseconds()
	}
	if d.MaxConcurrency > 0 {
		maxConc = d.MaxConcurrency
	}
	if d.RunTimeout > 0 {
		runTimeoutMS = d.RunTimeout.Milliseconds()
	}
	return limit, windowMS, maxConc, runTimeoutMS
}

// CreateTrigger inserts a trigger at version 1 and records that version.
// It returns pgdb.ErrConflict when the id is taken, also by a deleted
// trigger: ids are never reused, so deliveries always name one definition
// history.
func CreateTrigger(ctx context.Context, db DB, id string, d Definition) (Trigger, error) {
	limit, windowMS, maxConc, runTimeoutMS := nullable(d)
	t, err := scanTrigger(db.QueryRow(ctx, `
		INSERT INTO workflow_triggers (trigger_id, name, source, event_type, predicate,
			throttle_limit, throttle_window_ms, throttle_key, max_concurrency, workflow, enabled, run_timeout_ms)
		VALUES ($1, $2, $3, $4, $5, $6, $7, $8, $9, $10, $11, $12)
		ON CONFLICT (trigger_id) DO NOTHING
		RETURNING `+triggerColumns,
		id, d.Name, d.Source, d.EventType, d.Predicate, limit, windowMS, d.ThrottleKey, maxConc, d.Workflow, d.Enabled, runTimeoutMS))
	if err != nil {
		if errors.Is(err, pgx.ErrNoRows) {
			return Trigger{}, fmt.Errorf("create trigger %s: it already exists: %w", id, pgdb.ErrConflict)
		}
		return Trigger{}, fmt.Errorf("create trigger: %w", err)
	}
	if err := insertVersion(ctx, db, t, false); err != nil {
		return Trigger{}, err
	}
	return t, nil
}

func insertVersion(ctx context.Context, db DB, t Trigger, deleted bool) error {
	def, err := json.Marshal(toSnapshot(t.Definition, deleted))
	if err != nil {
		return fmt.Errorf("marshal trigger version: %w", err)
	}
	if _, err := db.Exec(ctx, `
		INSERT INTO workflow_trigger_versions (trigger_id, version, definition, created_at)
		VALUES ($1, $2, $3, $4)`, t.ID, t.Version, def, t.UpdatedAt); err != nil {
		return fmt.Errorf("insert trigger version: %w", err)
	}
	return nil
}

// GetTrigger reads a trigger that is not deleted.
func GetTrigger(ctx context.Context, db DB, id string) (Trigger, error) {
	return pgrows.One(ctx, db, "get trigger", scanTrigger,
		`SELECT `+triggerColumns+` FROM workflow_triggers WHERE trigger_id = $1 AND deleted_at IS NULL`, id)
}

// LockTrigger reads a trigger, deleted or not, and locks its row until the
// transaction ends. Every delivery decision for the trigger happens under
// this lock, which serializes the throttle and concurrency checks of all
// service instances.
func LockTrigger(ctx context.Context, db DB, id string) (Trigger, error) {
	return pgrows.One(ctx, db, "lock trigger", scanTrigger,
		`SELECT `+triggerColumns+` FROM workflow_triggers WHERE trigger_id = $1 FOR UPDATE`, id)
}

// UpdateTrigger replaces the definition of a trigger that is not deleted.
// A definition equal to the current one changes nothing (changed is false,
// the version stays); otherwise the version is bumped and recorded.
func UpdateTrigger(ctx context.Context, db DB, id string, d Definition) (t Trigger, changed bool, err error) {
	cur, err := pgrows.One(ctx, db, "update trigger", scanTrigger,
		`SELECT `+triggerColumns+` FROM workflow_triggers WHERE trigger_id = $1 AND deleted_at IS NULL FOR UPDATE`, id)
	if err != nil {
		return Trigger{}, false, err
	}
	if cur.Definition == d {
		return cur, false, nil
	}
	limit, windowMS, maxConc, runTimeoutMS := nullable(d)
	t, err = scanTrigger(db.QueryRow(ctx, `
		UPDATE workflow_triggers
		SET name = $2, source = $3, event_type = $4, predicate = $5, throttle_limit = $6,
		    throttle_window_ms = $7, throttle_key = $8, max_concurrency = $9, workflow = $10,
		    enabled = $11, run_timeout_ms = $12, version = version + 1, updated_at = now()
		WHERE trigger_id = $1
		RETURNING `+triggerColumns,
		id, d.Name, d.Source, d.EventType, d.Predicate, limit, windowMS, d.ThrottleKey, maxConc, d.Workflow, d.Enabled, runTimeoutMS))
	if err != nil {
		return Trigger{}, false, fmt.Errorf("update trigger: %w", err)
	}
	if err := insertVersion(ctx, db, t, false); err != nil {
		return Trigger{}, false, err
	}
	return t, true, nil
}

// SetEnabled enables or disables a trigger that is not deleted; changed is
// false when it already was.
func SetEnabled(ctx context.Context, db DB, id string, enabled bool) (t Trigger, changed bool, err error) {
	cur, err := GetTrigger(ctx, db, id)
	if err != nil {
		return Trigger{}, false, err
	}
	d := cur.Definition
	d.Enabled = enabled
	return UpdateTrigger(ctx, db, id, d)
}

// DeleteTrigger marks a trigger deleted, bumps its version and records the
// deletion. The row stays so deliveries waiting for a retry can tell a
// deleted trigger (cancel) from one that never existed.
func DeleteTrigger(ctx context.Context, db DB, id string) (Trigger, error) {
	t, err := pgrows.One(ctx, db, "delete trigger", scanTrigger, `
		UPDATE workflow_triggers
		SET deleted_at = now(), version = version + 1, updated_at = now()
		WHERE trigger_id = $1 AND deleted_at IS NULL
		RETURNING `+triggerColumns, id)
	if err != nil {
		return Trigger{}, err
	}
	if err := insertVersion(ctx, db, t, true); err != nil {
		return Trigger{}, err
	}
	return t, nil
}

// ListTriggersOptions filters and pages ListTriggers. Empty fields do not
// filter; After is the last id of the previous page.
type ListTriggersOptions struct {
	Source    string
	EventType string
	Enabled   *bool
	After     string
	Limit     int
}

// ListTriggers lists triggers that are not deleted, ordered by id.
func ListTriggers(ctx context.Context, db DB, o ListTriggersOptions) ([]Trigger, error) {
	return pgrows.All(ctx, db, "list triggers", scanTrigger, `
		SELECT `+triggerColumns+` FROM workflow_triggers
		WHERE deleted_at IS NULL
		  AND ($1 = '' OR source = $1)
		  AND ($2 = '' OR event_type = $2)
		  AND ($3::boolean IS NULL OR enabled = $3)
		  AND trigger_id > $4
		ORDER BY trigger_id
		LIMIT $5`, o.Source, o.EventType, o.Enabled, o.After, pageSize(o.Limit))
}

// MatchingTriggerIDs returns the enabled, not deleted triggers of a source
// and event type, in id order.
func MatchingTriggerIDs(ctx context.Context, db DB, source, eventType string) ([]string, error) {
	return pgrows.Strings(ctx, db, "match triggers", `
		SELECT trigger_id FROM workflow_triggers
		WHERE source = $1 AND event_type = $2 AND enabled AND deleted_at IS NULL
		ORDER BY trigger_id`, source, eventType)
}

// ListVersions returns every version of a trigger, deleted or not, oldest
// first. pgdb.ErrNotFound means the trigger never existed.
func ListVersions(ctx context.Context, db DB, id string) ([]Version, error) {
	out, err := pgrows.All(ctx, db, "list trigger versions", scanVersion, `
		SELECT trigger_id, version, definition, created_at FROM workflow_trigger_versions
		WHERE trigger_id = $1 ORDER BY version`, id)
	if err != nil {
		return nil, err
	}
	if len(out) == 0 {
		return nil, fmt.Errorf("list trigger versions: %w", pgdb.ErrNotFound)
	}
	return out, nil
}

func scanVersion(row pgx.Row) (Version, error) {
	var v Version
	var raw []byte
	if err := row.Scan(&v.TriggerID, &v.Version, &raw, &v.CreatedAt); err != nil {
		return Version{}, err
	}
	var s snapshot
	if err := json.Unmarshal(raw, &s); err != nil {
		return Version{}, fmt.Errorf("decode version %d: %w", v.Version, err)
	}
	v.Definition, v.Deleted = s.definition(), s.Deleted
	return v, nil
}
