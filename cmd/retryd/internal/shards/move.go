// Package shards reshards a running retryd: it splits the RETRIES stream
// into more scheduler shards and moves the rows of the items whose shard
// changed from the old shard's database to the new one's (docs/shards.md).
package shards

import (
	"context"
	"errors"
	"fmt"
	"slices"
	"strings"

	"github.com/jackc/pgx/v5"
	"github.com/rs/zerolog"

	"github.com/retryd/retryd/pkg/contract"
	"github.com/retryd/retryd/services/scheduler"
)

// ErrAbort is what a Hook returns to stop a move where it is, as a crash
// would (tests).
var ErrAbort = errors.New("move aborted")

// ErrShardRunning: items still belong to a new shard whose scheduler
// has started.
var ErrShardRunning = errors.New("new shard already running")

// Hook is called between the two commits of every batch: after the
// target committed the batch, before the source deletes it. An error
// stops the move there.
type Hook func(from, to int) error

// Move is one old shard's part of a split: its database and the
// databases of the shards its items may move to.
type Move struct {
	From    int
	Source  *pgx.Conn
	Targets map[int]*pgx.Conn
	// Shards is the new count.
	Shards int
	Batch  int
	DryRun bool
	Log    zerolog.Logger
	Hook   Hook
	// Running are the targets whose scheduler consumed already (up to
	// the stream sequence given): moving into one is refused.
	Running map[int]uint64
}

// Moved counts the items moved from one shard to another.
type Moved struct {
	From  int `json:"from"`
	To    int `json:"to"`
	Items int `json:"items"`
}

type itemKey struct{ kind, id string }

// Run moves every item of m.Source whose shard under m.Shards is not
// m.From. Each batch is locked in the source (the due loop claims with
// SKIP LOCKED, so it cannot emit a due for a row being moved), written
// to the target, which commits first, then deleted from the source. The
// target takes the source's copy whole (row replaced, history rewritten):
// a crash between the two commits leaves the item on both, the source's
// the live one (its scheduler may have emitted a due since), and a rerun
// copies it again. The target must not run yet (Split checks its
// consumer), so nothing else writes the item there.
func (m Move) Run(ctx context.Context) ([]Moved, error) {
	counts := map[int]int{}
	var after itemKey
	for {
		keys, err := scanKeys(ctx, m.Source, after, max(m.Batch, 1)*4)
		if err != nil {
			return nil, err
		}
		if len(keys) == 0 {
			break
		}
		after = keys[len(keys)-1]
		byTarget := map[int][]itemKey{}
		for _, k := range keys {
			if to := contract.Shard(k.kind, k.id, m.Shards); to != m.From {
				byTarget[to] = append(byTarget[to], k)
			}
		}
		for _, to := range sortedKeys(byTarget) {
			items := byTarget[to]
			if seq, ok := m.Running[to]; ok && !m.DryRun {
				return nil, fmt.Errorf("%w: shard %d's scheduler (consumer %s delivered up to %d) and %d item(s) of shard %d still belong to it: stop the new shards' schedulers until the split has moved their items",
					ErrShardRunning, to, scheduler.ConsumerNameOf(to), seq, len(items), m.From)
			}
			for len(items) > 0 {
				n := min(len(items), max(m.Batch, 1))
				if !m.DryRun {
					if err := m.moveBatch(ctx, to, items[:n]); err != nil {
						return nil, err
					}
				}
				counts[to] += n
				items = items[n:]
			}
			m.Log.Info().Int("from", m.From).Int("to", to).Int("items", counts[to]).Bool("dry_run", m.DryRun).Msg("moving items")
		}
	}
	out := make([]Moved, 0, len(counts))
	for _, to := range sortedKeys(counts) {
		out = append(out, Moved{From: m.From, To: to, Items: counts[to]})
	}
	return out, nil
}

func sortedKeys[V any](m map[int]V) []int {
	out := make([]int, 0, len(m))
	for k := range m {
		out = append(out, k)
	}
	slices.Sort(out)
	return out
}

// scanKeys reads the next keys after after, without locking: which items
// move is fixed once the old layout's facts are applied (Split waits for
// that), and each batch is locked when it is moved.
func scanKeys(ctx context.Context, c *pgx.Conn, after itemKey, limit int) ([]itemKey, error) {
	rows, err := c.Query(ctx, `SELECT kind, item_id FROM retries WHERE (kind, item_id) > ($1, $2) ORDER BY kind, item_id LIMIT $3`,
		after.kind, after.id, limit)
	if err != nil {
		return nil, fmt.Errorf("scan retries: %w", err)
	}
	out, err := pgx.CollectRows(rows, func(r pgx.CollectableRow) (itemKey, error) {
		var k itemKey
		return k, r.Scan(&k.kind, &k.id)
	})
	if err != nil {
		return nil, fmt.Errorf("scan retries: %w", err)
	}
	return out, nil
}

func keyArrays(keys []itemKey) (kinds, ids []string) {
	for _, k := range keys {
		kinds, ids = append(kinds, k.kind), append(ids, k.id)
	}
	return kinds, ids
}

// inBatch selects the rows of the batch's items ($1 kinds, $2 ids).
const inBatch = `(kind, item_id) IN (SELECT * FROM unnest($1::text[], $2::text[]))`

// moveBatch moves keys from the source to shard to. Rows travel as
// row_to_json (json, not jsonb: a json column such as payload keeps its
// text byte for byte) and are read back with json_populate_recordset,
// so every column of the schema moves, whatever migration added it.
func (m Move) moveBatch(ctx context.Context, to int, keys []itemKey) error {
	target := m.Targets[to]
	kinds, ids := keyArrays(keys)
	src, err := m.Source.Begin(ctx)
	if err != nil {
		return fmt.Errorf("begin on shard %d: %w", m.From, err)
	}
	defer src.Rollback(context.WithoutCancel(ctx)) //nolint:errcheck // no-op after commit
	var retries, history string
	// FOR UPDATE waits for a due emission holding a row, then reads the
	// row as that emission committed it.
	if err := src.QueryRow(ctx, `SELECT coalesce(json_agg(row_to_json(r)), '[]') FROM (
	SELECT * FROM retries WHERE `+inBatch+` ORDER BY kind, item_id FOR UPDATE) r`, kinds, ids).Scan(&retries); err != nil {
		return fmt.Errorf("lock retries on shard %d: %w", m.From, err)
	}
	if err := src.QueryRow(ctx, `SELECT coalesce(json_agg(row_to_json(h) ORDER BY h.kind, h.item_id, h.id), '[]')
FROM retry_history h WHERE `+inBatch, kinds, ids).Scan(&history); err != nil {
		return fmt.Errorf("read retry_history on shard %d: %w", m.From, err)
	}
	inboxIDs, err := appliedMsgIDs(ctx, src, keys)
	if err != nil {
		return err
	}
	var inbox string
	if err := src.QueryRow(ctx, `SELECT coalesce(json_agg(row_to_json(i)), '[]') FROM inbox i
WHERE consumer = $1 AND msg_id = ANY($2)`, scheduler.Owner, inboxIDs).Scan(&inbox); err != nil {
		return fmt.Errorf("read inbox on shard %d: %w", m.From, err)
	}
	if err := writeTarget(ctx, target, kinds, ids, retries, history, inbox); err != nil {
		return fmt.Errorf("write %d item(s) to shard %d: %w", len(keys), to, err)
	}
	if m.Hook != nil {
		if err := m.Hook(m.From, to); err != nil {
			return err
		}
	}
	if _, err := src.Exec(ctx, `DELETE FROM retry_history WHERE `+inBatch, kinds, ids); err != nil {
		return fmt.Errorf("delete retry_history on shard %d: %w", m.From, err)
	}
	if _, err := src.Exec(ctx, `DELETE FROM retries WHERE `+inBatch, kinds, ids); err != nil {
		return fmt.Errorf("delete retries on shard %d: %w", m.From, err)
	}
	if err := src.Commit(ctx); err != nil {
		return fmt.Errorf("commit on shard %d: %w", m.From, err)
	}
	return nil
}

// appliedMsgIDs are the message ids the policy stage may have claimed in
// the inbox for the items' facts: each policy fact of every attempt up to
// the row's next one. A fact republished after the duplicate window then
// stays a duplicate on the new shard.
func appliedMsgIDs(ctx context.Context, tx pgx.Tx, keys []itemKey) ([]string, error) {
	kinds, ids := keyArrays(keys)
	rows, err := tx.Query(ctx, `SELECT kind, item_id, attempt FROM retries WHERE `+inBatch, kinds, ids)
	if err != nil {
		return nil, fmt.Errorf("read attempts: %w", err)
	}
	defer rows.Close()
	var out []string
	for rows.Next() {
		var kind, id string
		var attempt int
		if err := rows.Scan(&kind, &id, &attempt); err != nil {
			return nil, fmt.Errorf("read attempts: %w", err)
		}
		for a := 0; a <= attempt+1; a++ {
			for _, ev := range []contract.Lifecycle{contract.Failed, contract.Held, contract.Succeeded, contract.Cancelled} {
				out = append(out, contract.LifecycleMsgID(kind, ev, id, a))
			}
		}
	}
	return out, rows.Err()
}

// writeTarget replaces the items on the target by the source's copy in
// one transaction.
func writeTarget(ctx context.Context, c *pgx.Conn, kinds, ids []string, retries, history, inbox string) error {
	cols, err := columns(ctx, c, "retries")
	if err != nil {
		return err
	}
	hcols, err := columns(ctx, c, "retry_history")
	if err != nil {
		return err
	}
	hcols = slices.DeleteFunc(hcols, func(s string) bool { return s == "id" }) // the target's identity numbers them
	set := make([]string, 0, len(cols))
	for _, col := range cols {
		set = append(set, col+" = EXCLUDED."+col)
	}
	tx, err := c.Begin(ctx)
	if err != nil {
		return fmt.Errorf("begin: %w", err)
	}
	defer tx.Rollback(context.WithoutCancel(ctx)) //nolint:errcheck // no-op after commit
	if _, err := tx.Exec(ctx, `INSERT INTO retries SELECT * FROM json_populate_recordset(NULL::retries, $1::json)
ON CONFLICT (kind, item_id) DO UPDATE SET `+strings.Join(set, ", "), retries); err != nil {
		return fmt.Errorf("write retries: %w", err)
	}
	// A rerun after a crash between the commits writes the history again:
	// the target's copy of a moved item's history is only ever an earlier
	// copy of the source's.
	if _, err := tx.Exec(ctx, `DELETE FROM retry_history WHERE `+inBatch, kinds, ids); err != nil {
		return fmt.Errorf("clear retry_history: %w", err)
	}
	hl := strings.Join(hcols, ", ")
	if _, err := tx.Exec(ctx, `INSERT INTO retry_history (`+hl+`)
SELECT `+hl+` FROM json_populate_recordset(NULL::retry_history, $1::json) WITH ORDINALITY ORDER BY ordinality`, history); err != nil {
		return fmt.Errorf("write retry_history: %w", err)
	}
	if _, err := tx.Exec(ctx, `INSERT INTO inbox SELECT * FROM json_populate_recordset(NULL::inbox, $1::json) ON CONFLICT DO NOTHING`, inbox); err != nil {
		return fmt.Errorf("write inbox: %w", err)
	}
	if err := tx.Commit(ctx); err != nil {
		return fmt.Errorf("commit: %w", err)
	}
	return nil
}

// columns lists a table's columns in order.
func columns(ctx context.Context, q interface {
	Query(context.Context, string, ...any) (pgx.Rows, error)
}, table string) ([]string, error) {
	rows, err := q.Query(ctx, `SELECT attname FROM pg_attribute WHERE attrelid = $1::regclass AND attnum > 0 AND NOT attisdropped ORDER BY attnum`, table)
	if err != nil {
		return nil, fmt.Errorf("read columns of %s: %w", table, err)
	}
	out, err := pgx.CollectRows(rows, pgx.RowTo[string])
	if err != nil {
		return nil, fmt.Errorf("read columns of %s: %w", table, err)
	}
	return out, nil
}
