package retrystore

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"time"

	"github.com/jackc/pgx/v5"

	"github.com/retryd/retryd/pkg/contract"
)

// PendingRelease is a release with rows left to apply (migration 00106):
// the next part ranks after Cursor.
type PendingRelease struct {
	MsgID   string
	Release contract.ReleasedData
	Cursor  ReleaseCursor
	// Behind: the parts run after the owner admitted their rows, as
	// fallbacks (see the scheduler's release loop).
	Behind bool
}

// SaveReleasePart records that release rd (message msgID) stopped at cur
// and that its next part is due at next (nil: at once).
func SaveReleasePart(ctx context.Context, q Querier, msgID string, rd contract.ReleasedData, cur ReleaseCursor, behind bool, next *time.Time) error {
	b, err := json.Marshal(rd)
	if err != nil {
		return fmt.Errorf("encode release %s: %w", msgID, err)
	}
	_, err = q.Exec(ctx, `INSERT INTO retry_release_parts (msg_id, kind, hold_key, hold_reason, release, numbered,
	after_held_since, after_created_at, after_item_id, behind, next_at)
VALUES ($1, $2, $3, $4, $5, $6, $7, $8, $9, $11, coalesce($10, now()))
ON CONFLICT (msg_id) DO UPDATE SET numbered = EXCLUDED.numbered, after_held_since = EXCLUDED.after_held_since,
	after_created_at = EXCLUDED.after_created_at, after_item_id = EXCLUDED.after_item_id, next_at = EXCLUDED.next_at`,
		msgID, rd.Kind, rd.HoldKey, rd.HoldReason, b, cur.Numbered, cur.HeldSince, cur.CreatedAt, cur.ItemID, next, behind)
	if err != nil {
		return fmt.Errorf("save release part %s: %w", msgID, err)
	}
	return nil
}

// SupersedeReleaseParts drops the parts left of earlier releases of every
// hold of rd's key that rd covers: rd ranks their rows again, and the
// earlier release would otherwise overwrite it part by part.
func SupersedeReleaseParts(ctx context.Context, q Querier, rd contract.ReleasedData) error {
	_, err := q.Exec(ctx, `DELETE FROM retry_release_parts
WHERE kind = $1 AND hold_key = $2 AND ($3 = '' OR hold_reason = $3) AND (release->>'released_at')::timestamptz <= $4`,
		rd.Kind, rd.HoldKey, rd.HoldReason, rd.ReleasedAt)
	if err != nil {
		return fmt.Errorf("supersede release parts of %s/%s: %w", rd.Kind, rd.HoldKey, err)
	}
	return nil
}

// ClaimReleasePart locks the release whose next part is due the earliest,
// if one is due now, skipping those another scheduler holds. nil: none.
// A row whose release does not decode is reported as a
// *MalformedReleaseError, still locked. q must be a transaction.
func ClaimReleasePart(ctx context.Context, q Querier) (*PendingRelease, error) {
	var p PendingRelease
	var raw []byte
	err := q.QueryRow(ctx, `SELECT msg_id, release, numbered, after_held_since, after_created_at, after_item_id, behind
FROM retry_release_parts WHERE next_at <= now() ORDER BY next_at LIMIT 1 FOR UPDATE SKIP LOCKED`).
		Scan(&p.MsgID, &raw, &p.Cursor.Numbered, &p.Cursor.HeldSince, &p.Cursor.CreatedAt, &p.Cursor.ItemID, &p.Behind)
	if errors.Is(err, pgx.ErrNoRows) {
		return nil, nil
	}
	if err != nil {
		return nil, fmt.Errorf("claim release part: %w", err)
	}
	if err := json.Unmarshal(raw, &p.Release); err != nil {
		return nil, &MalformedReleaseError{MsgID: p.MsgID, Err: err}
	}
	if err := p.Release.Validate(); err != nil {
		return nil, &MalformedReleaseError{MsgID: p.MsgID, Err: err}
	}
	return &p, nil
}

// MalformedReleaseError is a recorded release whose data cannot be
// decoded or is not a valid release; its row can never be applied.
type MalformedReleaseError struct {
	MsgID string
	Err   error
}

func (e *MalformedReleaseError) Error() string {
	return fmt.Sprintf("decode release %s: %v", e.MsgID, e.Err)
}

func (e *MalformedReleaseError) Unwrap() error { return e.Err }

// FinishReleaseParts forgets release msgID: it has no rows left.
func FinishReleaseParts(ctx context.Context, q Querier, msgID string) error {
	if _, err := q.Exec(ctx, `DELETE FROM retry_release_parts WHERE msg_id = $1`, msgID); err != nil {
		return fmt.Errorf("finish release %s: %w", msgID, err)
	}
	return nil
}

// NextReleasePartIn is how long until the earliest next part is due (0
// when one is due now); ok is false when no release has rows left.
func NextReleasePartIn(ctx context.Context, q Querier) (d time.Duration, ok bool, err error) {
	var us *int64
	err = q.QueryRow(ctx, `SELECT greatest(0, floor(extract(epoch FROM min(next_at) - now()) * 1000000))::bigint FROM retry_release_parts`).Scan(&us)
	if err != nil {
		return 0, false, fmt.Errorf("read next release part: %w", err)
	}
	if us == nil {
		return 0, false, nil
	}
	return time.Duration(*us) * time.Microsecond, true, nil
}

// ReleaseExtent counts the rows release rd (of every hold: Count 0) takes
// and finds the earliest time one of them comes due on its own (nil when
// none does).
func ReleaseExtent(ctx context.Context, q Querier, rd contract.ReleasedData) (int64, *time.Time, error) {
	var n int64
	var earliest *time.Time
	err := q.QueryRow(ctx, `SELECT count(*), min(next_attempt_at) FROM retries
WHERE kind = $1 AND hold_key = $2 AND held_since IS NOT NULL AND state = 'scheduled'
  AND ($3 = '' OR hold_reason = $3) AND held_since <= $4`,
		rd.Kind, rd.HoldKey, rd.HoldReason, rd.ReleasedAt).Scan(&n, &earliest)
	if err != nil {
		return 0, nil, fmt.Errorf("measure release of %s/%s: %w", rd.Kind, rd.HoldKey, err)
	}
	return n, earliest, nil
}
