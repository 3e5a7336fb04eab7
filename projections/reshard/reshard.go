// Package reshard moves the scheduler's rows between shard databases when
// RETRIES is split into more shards (docs/shards.md, Resharding): each
// item's row and history go to the database of the shard
// contract.Shard(kind, id, n) names under the new count.
//
// A move is safe to interrupt and to run again, and the scheduler of the
// source shard may keep running while it goes. Per batch, the source
// transaction locks the rows it moves (the due loop and the policy stage
// skip or wait for locked rows, so no due is emitted for a row in
// flight); the target transaction inserts each row with its history and
// commits; then the source deletes them and commits. An interruption
// after the target's commit leaves a row in both: the next run finds it
// in the target (the insert does nothing, so its history is not copied
// twice) and deletes it from the source.
//
// The target shards' schedulers must not run before the move is done:
// they would not find the rows they are to decide on.
package reshard

import (
	"context"
	"errors"
	"fmt"
	"strings"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgxpool"

	"github.com/retryd/retryd/pkg/contract"
)

// DefaultBatch is how many rows one pair of transactions moves.
const DefaultBatch = 500

// Options configures Move.
type Options struct {
	// Shards is the new shard count: Pools has one database per shard.
	Shards int
	// Batch bounds the rows one pair of transactions moves; default
	// DefaultBatch.
	Batch int
	// DryRun counts what would move and changes nothing.
	DryRun bool
	// Progress, when set, is called after each batch.
	Progress func(Progress)
	// Failpoint is for tests: called with "target.committed" after a
	// target transaction committed and before the source's; an error
	// there stops the move as if the process died.
	Failpoint func(name string) error
}

// FailpointTargetCommitted names the place between the two commits.
const FailpointTargetCommitted = "target.committed"

// Progress is what a batch moved, and the totals so far.
type Progress struct {
	From  int   `json:"from"`
	Moved int64 `json:"moved"`
	Total int64 `json:"total"`
}

// Stats counts a move: per source shard and target shard, the rows that
// went (or, in a dry run, would go) there.
type Stats struct {
	Moved map[string]int64 `json:"moved"` // "<from>-><to>"
	// Rows is the rows moved (or that would move) in all. Rows a running
	// scheduler holds locked are taken on a later pass: Move returns once
	// none is left.
	Rows int64 `json:"rows"`
	// Releases is the release records (retry_hold_releases and the
	// inbox claims of finished releases) copied to every shard.
	Releases int64 `json:"releases"`
}

// Move moves every row of pools[i] whose shard under opts.Shards is not i
// to the database of its shard.
func Move(ctx context.Context, pools []*pgxpool.Pool, opts Options) (Stats, error) {
	if opts.Shards < 1 || opts.Shards > contract.MaxShards || len(pools) != opts.Shards {
		return Stats{}, fmt.Errorf("move rows: %d databases for %d shards: give one per shard", len(pools), opts.Shards)
	}
	if opts.Batch <= 0 {
		opts.Batch = DefaultBatch
	}
	st := Stats{Moved: map[string]int64{}}
	if !opts.DryRun {
		n, err := copyReleases(ctx, pools)
		if err != nil {
			return st, err
		}
		st.Releases = n
	}
	for from, src := range pools {
		if err := moveFrom(ctx, pools, from, src, opts, &st); err != nil {
			return st, fmt.Errorf("move rows from shard %d: %w", from, err)
		}
	}
	return st, nil
}

type key struct{ kind, id string }

// moveFrom walks the keys of src in order and moves those of another
// shard, a batch at a time; rows a running scheduler holds locked are
// taken on a later pass.
func moveFrom(ctx context.Context, pools []*pgxpool.Pool, from int, src *pgxpool.Pool, opts Options, st *Stats) error {
	for pass := 0; ; pass++ {
		var after key
		var busy int
		for {
			keys, err := nextKeys(ctx, src, after, 4*opts.Batch)
			if err != nil {
				return err
			}
			if len(keys) == 0 {
				break
			}
			after = keys[len(keys)-1]
			var movers []key
			for _, k := range keys {
				if contract.Shard(k.kind, k.id, opts.Shards) != from {
					movers = append(movers, k)
				}
			}
			for len(movers) > 0 {
				n := min(len(movers), opts.Batch)
				if opts.DryRun {
					for _, k := range movers[:n] {
						st.Moved[fmt.Sprintf("%d->%d", from, contract.Shard(k.kind, k.id, opts.Shards))]++
						st.Rows++
					}
				} else {
					moved, skipped, err := moveBatch(ctx, pools, from, src, movers[:n], opts, st)
					if err != nil {
						return err
					}
					busy += skipped
					st.Rows += moved
					if opts.Progress != nil {
						opts.Progress(Progress{From: from, Moved: moved, Total: st.Rows})
					}
				}
				movers = movers[n:]
			}
		}
		if busy == 0 || opts.DryRun {
			return nil
		}
		if pass > 1000 {
			return fmt.Errorf("%d rows stayed locked by a running scheduler through %d passes", busy, pass)
		}
		if err := sleep(ctx, pass); err != nil {
			return err
		}
	}
}

func nextKeys(ctx context.Context, pool *pgxpool.Pool, after key, limit int) ([]key, error) {
	rows, err := pool.Query(ctx, `SELECT kind, item_id FROM retries WHERE (kind, item_id) > ($1, $2) ORDER BY kind, item_id LIMIT $3`,
		after.kind, after.id, limit)
	if err != nil {
		return nil, fmt.Errorf("read keys: %w", err)
	}
	var out []key
	var k key
	_, err = pgx.ForEachRow(rows, []any{&k.kind, &k.id}, func() error { out = append(out, k); return nil })
	if err != nil {
		return nil, fmt.Errorf("read keys: %w", err)
	}
	return out, nil
}

// moveBatch moves the rows of keys it can lock; it returns how many it
// moved and how many were locked by someone else.
func moveBatch(ctx context.Context, pools []*pgxpool.Pool, from int, src *pgxpool.Pool, keys []key, opts Options, st *Stats) (int64, int, error) {
	kinds, ids := make([]string, len(keys)), make([]string, len(keys))
	for i, k := range keys {
		kinds[i], ids[i] = k.kind, k.id
	}
	tx, err := src.Begin(ctx)
	if err != nil {
		return 0, 0, fmt.Errorf("begin source: %w", err)
	}
	defer tx.Rollback(context.WithoutCancel(ctx)) //nolint:errcheck // no-op after commit
	rows, err := tx.Query(ctx, `SELECT r.kind, r.item_id, row_to_json(r)::text FROM retries r
JOIN unnest($1::text[], $2::text[]) AS k(kind, item_id) USING (kind, item_id)
FOR UPDATE OF r SKIP LOCKED`, kinds, ids)
	if err != nil {
		return 0, 0, fmt.Errorf("lock rows: %w", err)
	}
	byTarget := map[int][]string{}
	locked := map[int][]key{}
	var k key
	var doc string
	if _, err := pgx.ForEachRow(rows, []any{&k.kind, &k.id, &doc}, func() error {
		to := contract.Shard(k.kind, k.id, opts.Shards)
		byTarget[to] = append(byTarget[to], doc)
		locked[to] = append(locked[to], k)
		return nil
	}); err != nil {
		return 0, 0, fmt.Errorf("lock rows: %w", err)
	}
	var moved int64
	for to, docs := range byTarget {
		hist, err := history(ctx, tx, locked[to])
		if err != nil {
			return 0, 0, err
		}
		if err := insert(ctx, pools[to], docs, hist); err != nil {
			return 0, 0, fmt.Errorf("insert into shard %d: %w", to, err)
		}
		st.Moved[fmt.Sprintf("%d->%d", from, to)] += int64(len(docs))
		moved += int64(len(docs))
	}
	if opts.Failpoint != nil {
		if err := opts.Failpoint(FailpointTargetCommitted); err != nil {
			return 0, 0, err
		}
	}
	var lk, li []string
	for _, ks := range locked {
		for _, k := range ks {
			lk, li = append(lk, k.kind), append(li, k.id)
		}
	}
	for _, q := range []string{
		`DELETE FROM retry_history h USING unnest($1::text[], $2::text[]) AS k(kind, item_id) WHERE h.kind = k.kind AND h.item_id = k.item_id`,
		`DELETE FROM retries r USING unnest($1::text[], $2::text[]) AS k(kind, item_id) WHERE r.kind = k.kind AND r.item_id = k.item_id`,
	} {
		if _, err := tx.Exec(ctx, q, lk, li); err != nil {
			return 0, 0, fmt.Errorf("delete moved rows: %w", err)
		}
	}
	if err := tx.Commit(ctx); err != nil {
		return 0, 0, fmt.Errorf("commit source: %w", err)
	}
	return moved, len(keys) - len(lk), nil
}

// history reads the history of keys, oldest first, each entry as JSON
// keyed by its item.
func history(ctx context.Context, tx pgx.Tx, keys []key) (map[key][]string, error) {
	kinds, ids := make([]string, len(keys)), make([]string, len(keys))
	for i, k := range keys {
		kinds[i], ids[i] = k.kind, k.id
	}
	rows, err := tx.Query(ctx, `SELECT h.kind, h.item_id, (to_jsonb(h) - 'id')::text FROM retry_history h
JOIN unnest($1::text[], $2::text[]) AS k(kind, item_id) USING (kind, item_id) ORDER BY h.id`, kinds, ids)
	if err != nil {
		return nil, fmt.Errorf("read history: %w", err)
	}
	out := map[key][]string{}
	var k key
	var doc string
	_, err = pgx.ForEachRow(rows, []any{&k.kind, &k.id, &doc}, func() error { out[k] = append(out[k], doc); return nil })
	if err != nil {
		return nil, fmt.Errorf("read history: %w", err)
	}
	return out, nil
}

// insert writes rows into the target in one transaction, and the history
// of each row it inserted: a row already there was moved by an earlier,
// interrupted run, with its history.
func insert(ctx context.Context, pool *pgxpool.Pool, docs []string, hist map[key][]string) error {
	cols, err := historyColumns(ctx, pool)
	if err != nil {
		return err
	}
	tx, err := pool.Begin(ctx)
	if err != nil {
		return fmt.Errorf("begin: %w", err)
	}
	defer tx.Rollback(context.WithoutCancel(ctx)) //nolint:errcheck // no-op after commit
	rows, err := tx.Query(ctx, `INSERT INTO retries SELECT r.* FROM unnest($1::text[]) AS d(doc),
LATERAL json_populate_record(NULL::retries, d.doc::json) AS r
ON CONFLICT (kind, item_id) DO NOTHING RETURNING kind, item_id`, docs)
	if err != nil {
		return fmt.Errorf("insert rows: %w", err)
	}
	var entries []string
	var k key
	if _, err := pgx.ForEachRow(rows, []any{&k.kind, &k.id}, func() error {
		entries = append(entries, hist[k]...)
		return nil
	}); err != nil {
		return fmt.Errorf("insert rows: %w", err)
	}
	if len(entries) > 0 {
		list := prefixed("", cols)
		q := fmt.Sprintf(`INSERT INTO retry_history (%s) SELECT %s FROM unnest($1::text[]) WITH ORDINALITY AS d(doc, n),
LATERAL jsonb_populate_record(NULL::retry_history, d.doc::jsonb) AS h ORDER BY d.n`, list, prefixed("h.", cols))
		if _, err := tx.Exec(ctx, q, entries); err != nil {
			return fmt.Errorf("insert history: %w", err)
		}
	}
	if err := tx.Commit(ctx); err != nil {
		return fmt.Errorf("commit: %w", err)
	}
	return nil
}

// historyColumns are retry_history's columns but its identity: the
// target numbers the moved entries after its own, in their order.
func historyColumns(ctx context.Context, pool *pgxpool.Pool) ([]string, error) {
	rows, err := pool.Query(ctx, `SELECT attname FROM pg_attribute
WHERE attrelid = 'retry_history'::regclass AND attnum > 0 AND NOT attisdropped AND attname <> 'id' ORDER BY attnum`)
	if err != nil {
		return nil, fmt.Errorf("read history columns: %w", err)
	}
	cols, err := pgx.CollectRows(rows, pgx.RowTo[string])
	if err != nil {
		return nil, fmt.Errorf("read history columns: %w", err)
	}
	if len(cols) == 0 {
		return nil, errors.New("read history columns: retry_history has none: is the database migrated?")
	}
	return cols, nil
}

func prefixed(p string, cols []string) string {
	out := make([]string, len(cols))
	for i, c := range cols {
		out[i] = p + pgx.Identifier{c}.Sanitize()
	}
	return strings.Join(out, ", ")
}
