package reshard

import (
	"context"
	"fmt"
	"math"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgxpool"
)

// inboxConsumer is the scheduler's inbox consumer (scheduler.Owner).
const inboxConsumer = "scheduler"

// copyReleases gives every shard what each knows of releases, which are
// not items: every shard takes every release fact (a hold key's held
// items live on every shard). A new shard's consumer reads RETRIES from
// its start, releases included; with the claims of the releases already
// applied, it takes those as the duplicates they are instead of
// releasing the moved rows again. A release still being applied in parts
// (retry_release_parts) is not copied: the new shard applies it to the
// rows it gets. And the last release of each key (retry_hold_releases)
// releases a hold decided before it but applied after it, on every
// shard.
func copyReleases(ctx context.Context, pools []*pgxpool.Pool) (int64, error) {
	var n int64
	for from, src := range pools {
		rows, err := src.Query(ctx, `SELECT kind, hold_key, hold_reason, released_at FROM retry_hold_releases`)
		if err != nil {
			return n, fmt.Errorf("read releases of shard %d: %w", from, err)
		}
		type rel struct {
			kind, key, reason string
			at                time.Time
		}
		var rels []rel
		var r rel
		if _, err := pgx.ForEachRow(rows, []any{&r.kind, &r.key, &r.reason, &r.at}, func() error { rels = append(rels, r); return nil }); err != nil {
			return n, fmt.Errorf("read releases of shard %d: %w", from, err)
		}
		claims, err := src.Query(ctx, `SELECT msg_id, applied_at FROM inbox i WHERE consumer = $1 AND msg_id LIKE '%-released:%'
AND NOT EXISTS (SELECT 1 FROM retry_release_parts p WHERE p.msg_id = i.msg_id)`, inboxConsumer)
		if err != nil {
			return n, fmt.Errorf("read release claims of shard %d: %w", from, err)
		}
		var ids []string
		var ats []time.Time
		var id string
		var at time.Time
		if _, err := pgx.ForEachRow(claims, []any{&id, &at}, func() error { ids, ats = append(ids, id), append(ats, at); return nil }); err != nil {
			return n, fmt.Errorf("read release claims of shard %d: %w", from, err)
		}
		for to, dst := range pools {
			if to == from {
				continue
			}
			b := &pgx.Batch{}
			for _, r := range rels {
				b.Queue(`INSERT INTO retry_hold_releases (kind, hold_key, hold_reason, released_at) VALUES ($1, $2, $3, $4)
ON CONFLICT (kind, hold_key, hold_reason) DO UPDATE SET released_at = greatest(retry_hold_releases.released_at, EXCLUDED.released_at)`,
					r.kind, r.key, r.reason, r.at)
			}
			if len(ids) > 0 {
				b.Queue(`INSERT INTO inbox (consumer, msg_id, applied_at) SELECT $1, m, a FROM unnest($2::text[], $3::timestamptz[]) AS c(m, a)
ON CONFLICT DO NOTHING`, inboxConsumer, ids, ats)
			}
			if b.Len() == 0 {
				continue
			}
			if err := dst.SendBatch(ctx, b).Close(); err != nil {
				return n, fmt.Errorf("copy releases of shard %d to shard %d: %w", from, to, err)
			}
			n += int64(len(rels) + len(ids))
		}
	}
	return n, nil
}

// sleep waits a little longer on each pass over rows a running scheduler
// held locked: its transactions last milliseconds.
func sleep(ctx context.Context, pass int) error {
	d := time.Duration(math.Min(float64(10*time.Millisecond)*math.Pow(2, float64(pass)), float64(time.Second)))
	t := time.NewTimer(d)
	defer t.Stop()
	select {
	case <-ctx.Done():
		return ctx.Err()
	case <-t.C:
		return nil
	}
}
