package retrystore

import (
	"context"
	"fmt"
	"time"
)

// RecordRelease remembers that the holds of kind under holdKey, of
// holdReason ("" for every reason), lifted at at (the latest release wins).
// A hold decided before that time but applied after the release is then
// released as it is applied (see ReleasedAfter): the release fact cannot
// reach a row that did not exist yet.
func RecordRelease(ctx context.Context, q Querier, kind, holdKey, holdReason string, at time.Time) error {
	_, err := q.Exec(ctx, `INSERT INTO retry_hold_releases (kind, hold_key, hold_reason, released_at) VALUES ($1, $2, $3, $4)
ON CONFLICT (kind, hold_key, hold_reason) DO UPDATE SET released_at = greatest(retry_hold_releases.released_at, EXCLUDED.released_at)`,
		kind, holdKey, holdReason, at)
	if err != nil {
		return fmt.Errorf("record release of %s/%s: %w", kind, holdKey, err)
	}
	return nil
}

// ReleasedAfter reports whether the holds of kind under holdKey and of
// holdReason were released at or after heldAt, by a release of that
// reason or of every reason. A release of another reason (a freed
// concurrency slot, for a throttle hold) does not count.
func ReleasedAfter(ctx context.Context, q Querier, kind, holdKey, holdReason string, heldAt time.Time) (bool, error) {
	var released bool
	err := q.QueryRow(ctx, `SELECT EXISTS (SELECT 1 FROM retry_hold_releases
WHERE kind = $1 AND hold_key = $2 AND hold_reason IN ('', $3) AND released_at >= $4)`, kind, holdKey, holdReason, heldAt).Scan(&released)
	if err != nil {
		return false, fmt.Errorf("read release of %s/%s: %w", kind, holdKey, err)
	}
	return released, nil
}

// Released is what ReleaseHolds did.
type Released struct {
	Rows int64
	// Last is the next_attempt_at of the last row released (zero when
	// none was).
	Last time.Time
}

// ReleaseHolds makes every scheduled row of kind held under holdKey come
// due now, in one statement: rows are ordered by when
// their hold began (then by id) and get next_attempt_at now() plus their
// rank in microseconds, so the due loop emits them in arrival order. Each
// gets a rescheduled history entry decided by "resume" under msgID. Rows
// already due by now (released before, or their pause ended) are left
// alone. q must be a transaction.
//
// holdReason, when not empty, releases only holds of that reason; limit,
// when above 0, releases at most that many, those held longest first.
func ReleaseHolds(ctx context.Context, q Querier, kind, holdKey, reason, msgID, holdReason string, limit int) (Released, error) {
	var out Released
	var last *time.Time
	err := q.QueryRow(ctx, `
WITH held AS (
	SELECT kind, item_id, held_since, created_at FROM retries
	WHERE kind = $1 AND hold_key = $2 AND held_since IS NOT NULL AND state = 'scheduled'
	  AND next_attempt_at > now() AND ($5 = '' OR hold_reason = $5)
	ORDER BY held_since, created_at, item_id
	LIMIT nullif($6::int, 0)
	FOR UPDATE
), ranked AS (
	SELECT kind, item_id, row_number() OVER (ORDER BY held_since NULLS LAST, created_at, item_id) AS n FROM held
), upd AS (
	UPDATE retries r SET next_attempt_at = now() + ranked.n * interval '1 microsecond', updated_at = now()
	FROM ranked
	WHERE r.kind = ranked.kind AND r.item_id = ranked.item_id
	RETURNING r.kind, r.item_id, r.attempt, r.job_type, r.source, r.policy_name, r.policy_version,
		r.next_attempt_at, r.retry_count, r.max_retries, r.held_since, r.hold_reason
), hist AS (
	INSERT INTO retry_history (kind, item_id, attempt, event, job_type, source, delay_ms, decided_by,
		policy_name, policy_version, next_attempt_at, detail, msg_id, at)
	SELECT kind, item_id, attempt, 'rescheduled', job_type, source, 0, 'resume', policy_name, policy_version,
		next_attempt_at, jsonb_build_object('decided_by', 'resume', 'hold_key', $2::text, 'hold_reason', hold_reason,
			'held_since', held_since, 'retry_count', retry_count, 'max_retries', max_retries,
			'note', 'released by a release fact ('||$4::text||')'),
		$3, now()
	FROM upd
)
SELECT count(*), max(next_attempt_at) FROM upd`, kind, holdKey, msgID, reason, holdReason, limit).Scan(&out.Rows, &last)
	if err != nil {
		return Released{}, fmt.Errorf("release holds of %s/%s: %w", kind, holdKey, err)
	}
	if last != nil {
		out.Last = *last
	}
	return out, nil
}
