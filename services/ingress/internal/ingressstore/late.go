package ingressstore

import (
	"context"
	"time"

	"github.com/jackc/pgx/v5"

	"github.com/retryd/retryd/internal/pgrows"
)

// admitLate admits the holders of source still in line before the one at
// slotAt whose slots came and went without their dues: ownTurn calls it
// only when no holder ahead has its slot come less than turnLate ago or
// waits for its turn, so every one it finds is late by more than that.
// Such a due may be lost with the ingress that had it (it returns after
// the ack wait) or held up on its way, and the line cannot wait for it:
// one dead ingress would stall the source. Passing those holders instead
// broke arrival order (1 to 18 of a 10,000-event throttled burst, up to
// 22 places). Admitted here, first, in line order and in the transaction
// of the holder behind them, they reach EVENTS ahead of it. Their dues,
// when they come, find the events admitted and answer succeeded as for
// any due of an admitted event, so the scheduler closes their retries
// from a due it emitted, as usual.
//
// Each leaves deferred for admitted (at the decision's time now), leaves
// the line and completes its retry row; the caller counts them in the
// rate window with the holder (CountAdmission) and publishes them before
// it. An event another transaction has locked (a due deciding it right
// now, on another instance) is skipped rather than waited for: that due
// decides it, and waiting could deadlock. A type the source no longer
// allows stays for its due, which cancels it.
func admitLate(ctx context.Context, tx pgx.Tx, source string, slotAt, now time.Time) ([]Released, error) {
	return pgrows.All(ctx, tx, "admit late holders of "+source, scanReleased, `
WITH line AS (
	SELECT h.event_id, h.slot_at FROM event_source_holds h JOIN workflow_events e ON e.event_id = h.event_id
	WHERE h.source = $1 AND NOT h.released AND h.slot_at > $2 AND h.slot_at < $3 AND h.slot_at <= $4
	  AND e.status = 'deferred' AND `+allowedType+`
	ORDER BY h.slot_at, h.event_id
	FOR UPDATE OF h, e SKIP LOCKED
), `+admitLineCTEs("$4")+admittedLine, source, now.Add(-holderGrace), slotAt, now)
}
