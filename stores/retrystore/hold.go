package retrystore

import (
	"context"
	"fmt"
	"time"

	"github.com/retryd/retryd/pkg/contract"
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
	// Rows is how many rows were released; Ranked how many were ranked
	// (a row closed meanwhile is ranked, not released).
	Rows, Ranked int64
	// First and Last are the earliest and the latest next_attempt_at of
	// the rows released (zero when none was).
	First, Last time.Time
	// Cursor is where the release stopped, for the next part.
	Cursor ReleaseCursor
}

// ReleaseCursor is where a release applied in parts stopped: how many rows
// it ranked so far, and the hold order (held_since, created_at, item_id)
// of the last one. The zero value is the start.
type ReleaseCursor struct {
	Numbered  int64
	HeldSince time.Time
	CreatedAt time.Time
	ItemID    string
}

// ReleaseHolds carries out release rd whole; see ReleaseHoldsPart.
func ReleaseHolds(ctx context.Context, q Querier, msgID string, rd contract.ReleasedData, ownerGrace time.Duration) (Released, error) {
	return ReleaseHoldsPart(ctx, q, msgID, rd, ownerGrace, ReleaseCursor{}, 0)
}

// ReleaseHoldsPart carries out release rd (msgID is its message id), or
// with rows above 0 the part of it that follows after: at most rows rows,
// ranked from after.Numbered+1 on. Every scheduled row of rd.Kind held
// under rd.HoldKey comes due, set-based. Rows are ranked by when their
// hold began (then by when they were created, then by id). Without a pace
// they get next_attempt_at now() plus their rank in microseconds, so the
// due loop emits them in arrival order; rows already due by now (released
// before, or their pause ended) are left alone. With rd.Pace the row of
// rank i gets rd.Pace.DueAt(i), due or not, so the release runs at the
// owner's rate, one due per item.
// A release of every hold (rd.Count 0) brings back only holds that began
// at or before rd.ReleasedAt: a release fact the scheduler applies after
// holds the owner decided after it (the owner's facts race on RETRIES)
// must not bring those back early. A partial release (a freed slot) takes
// the holds that waited longest, whenever they began: the one it frees a
// slot for may have been held a moment after the run ended; it is never
// applied in parts.
// Each row gets a rescheduled history entry decided by "resume". q must be
// a transaction.
//
// rd.HoldReason, when not empty, releases only holds of that reason;
// rd.Count, when above 0, releases at most that many, those held longest
// first.
//
// rd.OwnerAdmits: the owner brings each item back itself at the time
// computed above and answers with succeeded. Each row's due then comes
// ownerGrace after that time, only in case the owner never answers, and
// its history records the owner's time (owner_admits_at).
//
// A part ranks the rows it finds: a row of the release the owner closed
// before its part ran is not ranked, and the rows after it rank one
// earlier than the owner's line. The scheduler runs each part ahead of
// its slots so that does not happen; when it does (the scheduler was
// down), only the fallback due of an owner-admitted row comes earlier,
// and a due that comes before the item's turn waits for it.
func ReleaseHoldsPart(ctx context.Context, q Querier, msgID string, rd contract.ReleasedData, ownerGrace time.Duration,
	after ReleaseCursor, rows int) (Released, error) {
	var out Released
	var first, last, lastHeld, lastCreated *time.Time
	var lastID *string
	var from *time.Time
	var skip, limit int
	windowUS, spacingUS, quantumUS := int64(0), int64(1), int64(1)
	if p := rd.Pace; p != nil {
		from, skip, limit = &p.From, p.Skip, p.Limit
		windowUS, spacingUS = p.Window().Microseconds(), contract.SlotSpacing(p.Window(), p.Limit).Microseconds()
		quantumUS = min(contract.PaceQuantum, p.Window()).Microseconds()
	}
	var graceUS int64
	if rd.OwnerAdmits {
		graceUS = max(ownerGrace, 0).Microseconds()
	}
	take := rd.Count
	if rows > 0 && rd.Count == 0 {
		take = rows
	}
	var afterHeld, afterCreated *time.Time
	if after.ItemID != "" {
		afterHeld, afterCreated = &after.HeldSince, &after.CreatedAt
	}
	err := q.QueryRow(ctx, `
WITH held AS (
	SELECT kind, item_id, held_since, created_at FROM retries
	WHERE kind = $1 AND hold_key = $2 AND held_since IS NOT NULL AND state = 'scheduled'
	  AND ($7::timestamptz IS NOT NULL OR next_attempt_at > now()) AND ($5 = '' OR hold_reason = $5)
	  AND ($6::int > 0 OR held_since <= $13)
	  AND ($15::timestamptz IS NULL OR (held_since, created_at, item_id) > ($15::timestamptz, $16::timestamptz, $17::text))
	ORDER BY held_since, created_at, item_id
	LIMIT nullif($19::int, 0)
), numbered AS (
	SELECT kind, item_id, held_since, created_at,
		$18::bigint + row_number() OVER (ORDER BY held_since NULLS LAST, created_at, item_id) AS n FROM held
), ranked AS (
	-- contract.ReleasePace.DueAt in microseconds: the window, the
	-- quantum of the window holding the slot, the slot's place in it.
	SELECT kind, item_id, n, (g / $9::bigint) AS w, (g % $9::bigint) AS pos,
		(g % $9::bigint) * $11::bigint / $12::bigint * $12::bigint AS bucket
	FROM (SELECT kind, item_id, n, $8::bigint + n - 1 AS g FROM numbered) x
), upd AS (
	-- The hold ends at the item's slot (hold_until, for the views); the
	-- due comes then, or the owner's grace after it.
	UPDATE retries r SET next_attempt_at = $14::bigint * interval '1 microsecond' + slotted.slot,
		hold_until = slotted.slot, updated_at = now()
	FROM (SELECT kind, item_id, CASE WHEN $7::timestamptz IS NULL THEN now() + ranked.n * interval '1 microsecond'
		ELSE $7::timestamptz + (ranked.w * $10::bigint + ranked.bucket + ranked.pos - (ranked.bucket + $11::bigint - 1) / $11::bigint)
			* interval '1 microsecond' END AS slot FROM ranked) slotted
	-- No FOR UPDATE above: locking each row and then updating it wrote
	-- every tuple twice. A row closed since the snapshot is rechecked
	-- here and left alone; it keeps its rank, so the ranks stay the
	-- owner's.
	WHERE r.kind = slotted.kind AND r.item_id = slotted.item_id AND r.state = 'scheduled'
	RETURNING r.kind, r.item_id, r.attempt, r.job_type, r.source, r.policy_name, r.policy_version,
		r.next_attempt_at, r.retry_count, r.max_retries, r.held_since, r.hold_reason
), hist AS (
	INSERT INTO retry_history (kind, item_id, attempt, event, job_type, source, delay_ms, decided_by,
		policy_name, policy_version, next_attempt_at, detail, msg_id, at)
	SELECT kind, item_id, attempt, 'rescheduled', job_type, source,
		greatest(0, floor(extract(epoch FROM next_attempt_at - now()) * 1000))::bigint, 'resume', policy_name, policy_version,
		next_attempt_at, jsonb_build_object('decided_by', 'resume', 'hold_key', $2::text, 'hold_reason', hold_reason,
			'held_since', held_since, 'retry_count', retry_count, 'max_retries', max_retries,
			'note', 'released by a release fact ('||$4::text||')'
				|| CASE WHEN $7::timestamptz IS NULL THEN '' ELSE ', at its slot of '||$9::bigint||' per '||($10::bigint / 1000)||'ms' END)
			|| CASE WHEN $7::timestamptz IS NULL THEN '{}'::jsonb ELSE jsonb_build_object('pace', jsonb_build_object('limit', $9::bigint, 'window_ms', $10::bigint / 1000)) END
			|| CASE WHEN $14::bigint = 0 THEN '{}'::jsonb ELSE jsonb_build_object('owner_admits_at', next_attempt_at - $14::bigint * interval '1 microsecond',
				'note', 'released by a release fact ('||$4::text||'); the owner admits it itself, the due is a fallback') END,
		$3, now()
	FROM upd
)
SELECT (SELECT count(*) FROM upd), (SELECT count(*) FROM numbered), (SELECT min(next_attempt_at) FROM upd), (SELECT max(next_attempt_at) FROM upd),
	l.held_since, l.created_at, l.item_id
FROM (SELECT 1) one LEFT JOIN (SELECT held_since, created_at, item_id FROM numbered ORDER BY n DESC LIMIT 1) l ON true`,
		rd.Kind, rd.HoldKey, msgID, rd.Reason, rd.HoldReason, rd.Count, from, skip, max(limit, 1), windowUS, spacingUS, quantumUS, rd.ReleasedAt,
		graceUS, afterHeld, afterCreated, after.ItemID, after.Numbered, take).
		Scan(&out.Rows, &out.Ranked, &first, &last, &lastHeld, &lastCreated, &lastID)
	if err != nil {
		return Released{}, fmt.Errorf("release holds of %s/%s: %w", rd.Kind, rd.HoldKey, err)
	}
	out.Cursor = after
	if first != nil {
		out.First, out.Last = *first, *last
	}
	if lastID != nil {
		out.Cursor = ReleaseCursor{Numbered: after.Numbered + out.Ranked, HeldSince: *lastHeld, CreatedAt: *lastCreated, ItemID: *lastID}
	}
	return out, nil
}
