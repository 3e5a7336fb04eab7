package ingressstore

import (
	"context"
	"errors"
	"fmt"
	"slices"
	"time"

	"github.com/jackc/pgx/v5"

	"github.com/retryd/retryd/internal/pgrows"
	"github.com/retryd/retryd/stores/pgdb"
	"github.com/retryd/retryd/stores/pgtext"
)

// Source is a row of event_sources: the gate of one source. A source
// without a row has no limits.
type Source struct {
	Source string
	// RateLimit is how many events are admitted per RateWindow; nil means
	// no rate limit.
	RateLimit  *int
	RateWindow time.Duration
	Paused     bool
	// PausedUntil ends a pause by itself; nil with Paused means until resumed.
	PausedUntil  *time.Time
	PauseReason  string
	AllowedTypes []string
	UpdatedBy    string
	CreatedAt    time.Time
	UpdatedAt    time.Time
	// Deferred counts the source's events waiting for a retry (filled by
	// GetSource and ListSources).
	Deferred int64
}

// PausedAt reports whether the source is paused at now: paused with no end,
// or with an end after now.
func (s Source) PausedAt(now time.Time) bool {
	return s.Paused && (s.PausedUntil == nil || s.PausedUntil.After(now))
}

// AllowsType reports whether typ may be sent by the source: every type when
// AllowedTypes is empty.
func (s Source) AllowsType(typ string) bool {
	return len(s.AllowedTypes) == 0 || slices.Contains(s.AllowedTypes, typ)
}

const sourceColumns = `s.source, s.rate_limit, s.rate_window_ms, s.paused, s.paused_until, s.pause_reason,
	s.allowed_types, s.updated_by, s.created_at, s.updated_at`

func scanSource(row interface{ Scan(...any) error }, extra ...any) (Source, error) {
	var s Source
	var windowMS *int64
	dest := append([]any{&s.Source, &s.RateLimit, &windowMS, &s.Paused, &s.PausedUntil, &s.PauseReason,
		&s.AllowedTypes, &s.UpdatedBy, &s.CreatedAt, &s.UpdatedAt}, extra...)
	if err := row.Scan(dest...); err != nil {
		return Source{}, err
	}
	if windowMS != nil {
		s.RateWindow = time.Duration(*windowMS) * time.Millisecond
	}
	if s.AllowedTypes == nil {
		s.AllowedTypes = []string{}
	}
	return s, nil
}

const deferredCount = `(SELECT count(*) FROM workflow_events e WHERE e.source = s.source AND e.status = 'deferred')`

// GetSource reads a source's gate and its deferred count.
func GetSource(ctx context.Context, db DB, source string) (Source, error) {
	return pgrows.One(ctx, db, "get event source", scanCountedSource,
		`SELECT `+sourceColumns+`, `+deferredCount+` FROM event_sources s WHERE s.source = $1`, source)
}

// ListSources reads every configured source, by name.
func ListSources(ctx context.Context, db DB) ([]Source, error) {
	return pgrows.All(ctx, db, "list event sources", scanCountedSource,
		`SELECT `+sourceColumns+`, `+deferredCount+` FROM event_sources s ORDER BY s.source`)
}

// scanCountedSource scans sourceColumns followed by deferredCount.
func scanCountedSource(row pgx.Row) (Source, error) {
	var deferred int64
	s, err := scanSource(row, &deferred)
	if err != nil {
		return Source{}, err
	}
	s.Deferred = deferred
	return s, nil
}

// AllowedTypes returns the types a source may send; empty (also for a
// source without a row) means any type.
func AllowedTypes(ctx context.Context, db DB, source string) ([]string, error) {
	var types []string
	err := db.QueryRow(ctx, `SELECT allowed_types FROM event_sources WHERE source = $1`, source).Scan(&types)
	if errors.Is(err, pgx.ErrNoRows) {
		return nil, nil
	}
	if err != nil {
		return nil, fmt.Errorf("get allowed types: %w", err)
	}
	return types, nil
}

// SourceConfig is what an operator sets on a source with PutSource. It
// replaces the rate limit and allowed types and leaves a pause as it is.
type SourceConfig struct {
	Source string
	// RateLimit and RateWindow are both set (a limit) or both zero (none).
	RateLimit    int
	RateWindow   time.Duration
	AllowedTypes []string
	UpdatedBy    string
}

// Validate checks the config's values (the caller validates the source
// name and types against the contract).
func (c SourceConfig) Validate() error {
	switch {
	case c.RateLimit < 0:
		return fmt.Errorf("rate_limit must be positive, got %d", c.RateLimit)
	case c.RateWindow < 0:
		return fmt.Errorf("rate_window must be positive, got %s", c.RateWindow)
	case (c.RateLimit == 0) != (c.RateWindow == 0):
		return errors.New("rate_limit and rate_window are set together")
	case c.RateWindow != 0 && c.RateWindow < time.Millisecond:
		return fmt.Errorf("rate_window must be at least 1ms, got %s", c.RateWindow)
	}
	return nil
}

// PutSource creates or updates a source's rate limit and allowed types.
func PutSource(ctx context.Context, db DB, c SourceConfig) (Source, error) {
	if err := c.Validate(); err != nil {
		return Source{}, fmt.Errorf("put event source: %w", err)
	}
	var limit *int
	var windowMS *int64
	if c.RateLimit > 0 {
		limit = &c.RateLimit
		ms := c.RateWindow.Milliseconds()
		windowMS = &ms
	}
	types := c.AllowedTypes
	if types == nil {
		types = []string{}
	}
	_, err := db.Exec(ctx, `
		INSERT INTO event_sources (source, rate_limit, rate_window_ms, allowed_types, updated_by)
		VALUES ($1, $2, $3, $4, $5)
		ON CONFLICT (source) DO UPDATE SET
			rate_limit = EXCLUDED.rate_limit,
			rate_window_ms = EXCLUDED.rate_window_ms,
			allowed_types = EXCLUDED.allowed_types,
			updated_by = EXCLUDED.updated_by,
			updated_at = now()`,
		c.Source, limit, windowMS, types, c.UpdatedBy)
	if err == nil {
		// Slots were cut for the old limit; the held events come back on
		// the release the caller publishes and take new ones.
		_, err = db.Exec(ctx, `WITH holds AS (DELETE FROM event_source_holds WHERE source = $1)
			DELETE FROM event_source_slots WHERE source = $1`, c.Source)
	}
	if err != nil {
		return Source{}, fmt.Errorf("put event source: %w", err)
	}
	return GetSource(ctx, db, c.Source)
}

// PauseSource pauses a source until resumed (until nil) or until a time,
// creating its row when needed.
func PauseSource(ctx context.Context, db DB, source string, until *time.Time, reason, by string) (Source, error) {
	_, err := db.Exec(ctx, `
		INSERT INTO event_sources (source, paused, paused_until, pause_reason, updated_by)
		VALUES ($1, true, $2, $3, $4)
		ON CONFLICT (source) DO UPDATE SET
			paused = true,
			paused_until = EXCLUDED.paused_until,
			pause_reason = EXCLUDED.pause_reason,
			updated_by = EXCLUDED.updated_by,
			updated_at = now()`,
		source, until, pgtext.Clean(reason), pgtext.Clean(by))
	if err != nil {
		return Source{}, fmt.Errorf("pause event source: %w", err)
	}
	return GetSource(ctx, db, source)
}

// ResumeSource ends a source's pause. pgdb.ErrNotFound when the source has no row.
func ResumeSource(ctx context.Context, db DB, source, by string) (Source, error) {
	tag, err := db.Exec(ctx, `
		UPDATE event_sources
		SET paused = false, paused_until = NULL, pause_reason = '', updated_by = $2, updated_at = now()
		WHERE source = $1`, source, by)
	if err != nil {
		return Source{}, fmt.Errorf("resume event source: %w", err)
	}
	if tag.RowsAffected() == 0 {
		return Source{}, fmt.Errorf("resume event source: %w", pgdb.ErrNotFound)
	}
	return GetSource(ctx, db, source)
}
