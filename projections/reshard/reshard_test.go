package reshard_test

import (
	"context"
	"errors"
	"fmt"
	"testing"
	"time"

	"github.com/jackc/pgx/v5/pgxpool"
	"github.com/stretchr/testify/require"

	"github.com/retryd/retryd/migrations/pgtest"
	"github.com/retryd/retryd/pkg/contract"
	"github.com/retryd/retryd/projections/reshard"
)

func TestMain(m *testing.M) { pgtest.Main(m) }

type bundle struct {
	ctx   context.Context
	pools []*pgxpool.Pool
}

// setup is n shard databases, items on shard 0 (as before a split from
// one shard): n rows of kind "alpha", each with three history entries.
func setup(t *testing.T, shards, items int) bundle {
	t.Helper()
	b := bundle{ctx: context.Background()}
	for range shards {
		b.pools = append(b.pools, pgtest.NewPool(t))
	}
	for i := range items {
		id := fmt.Sprintf("item-%04d", i)
		_, err := b.pools[0].Exec(b.ctx, `INSERT INTO retries (kind, item_id, state, attempt, max_retries, next_attempt_at, payload, metadata)
VALUES ('alpha', $1, 'scheduled', 2, 5, now() + interval '1 hour', '{"n": 1}', '{"k": "v"}')`, id)
		require.NoError(t, err)
		for _, ev := range []string{"failed", "scheduled", "failed"} {
			_, err := b.pools[0].Exec(b.ctx, `INSERT INTO retry_history (kind, item_id, attempt, event, detail, msg_id) VALUES ('alpha', $1, 1, $2, '{"d": 1}', $3)`,
				id, ev, id+"-"+ev)
			require.NoError(t, err)
		}
	}
	return b
}

// where returns, per item, the shards whose database holds its row.
func (b bundle) where(t *testing.T) map[string][]int {
	t.Helper()
	out := map[string][]int{}
	for k, p := range b.pools {
		rows, err := p.Query(b.ctx, `SELECT item_id FROM retries`)
		require.NoError(t, err)
		for rows.Next() {
			var id string
			require.NoError(t, rows.Scan(&id))
			out[id] = append(out[id], k)
		}
		require.NoError(t, rows.Err())
	}
	return out
}

// history is the events of an item in the database of shard k, in order.
func (b bundle) history(t *testing.T, k int, id string) []string {
	t.Helper()
	rows, err := b.pools[k].Query(b.ctx, `SELECT event || ':' || msg_id || ':' || detail::text FROM retry_history WHERE kind = 'alpha' AND item_id = $1 ORDER BY id`, id)
	require.NoError(t, err)
	var out []string
	for rows.Next() {
		var s string
		require.NoError(t, rows.Scan(&s))
		out = append(out, s)
	}
	require.NoError(t, rows.Err())
	return out
}

// Splitting one shard into two moves exactly the items of shard 1, each
// with its whole history in order; the rest stay. A second run moves
// nothing.
func TestMoveSplitsOneIntoTwo(t *testing.T) {
	t.Parallel()
	b := setup(t, 2, 300)
	before := b.history(t, 0, "item-0001")

	dry, err := reshard.Move(b.ctx, b.pools, reshard.Options{Shards: 2, DryRun: true})
	require.NoError(t, err)
	require.Positive(t, dry.Rows)
	for id, shards := range b.where(t) {
		require.Equal(t, []int{0}, shards, "a dry run moves nothing: %s", id)
	}

	var progress int64
	st, err := reshard.Move(b.ctx, b.pools, reshard.Options{Shards: 2, Batch: 40, Progress: func(p reshard.Progress) { progress = p.Total }})
	require.NoError(t, err)
	require.Equal(t, dry.Rows, st.Rows)
	require.Equal(t, st.Rows, progress)
	require.Equal(t, st.Rows, st.Moved["0->1"])
	where := b.where(t)
	require.Len(t, where, 300)
	for id, shards := range where {
		require.Equal(t, []int{contract.Shard("alpha", id, 2)}, shards, id)
		require.Equal(t, len(before), len(b.history(t, shards[0], id)), id)
	}
	// One moved item, compared entry by entry.
	for id, shards := range where {
		if shards[0] == 1 {
			require.Equal(t, []string{"failed:" + id + "-failed:{\"d\": 1}", "scheduled:" + id + "-scheduled:{\"d\": 1}", "failed:" + id + "-failed:{\"d\": 1}"}, b.history(t, 1, id))
			require.Empty(t, b.history(t, 0, id))
			var payload, metadata string
			require.NoError(t, b.pools[1].QueryRow(b.ctx, `SELECT payload::text, metadata::text FROM retries WHERE kind = 'alpha' AND item_id = $1`, id).Scan(&payload, &metadata))
			require.Equal(t, `{"n": 1}`, payload)
			require.Equal(t, `{"k": "v"}`, metadata)
			break
		}
	}

	again, err := reshard.Move(b.ctx, b.pools, reshard.Options{Shards: 2})
	require.NoError(t, err)
	require.Zero(t, again.Rows, "a second run finds nothing to move")
}

// A move that dies after the target committed and before the source did
// leaves those rows on both; running it again deletes them from the
// source without copying their history twice.
func TestMoveInterruptedBetweenCommitsConverges(t *testing.T) {
	t.Parallel()
	b := setup(t, 2, 100)
	died := errors.New("killed")
	_, err := reshard.Move(b.ctx, b.pools, reshard.Options{Shards: 2, Batch: 10, Failpoint: func(name string) error {
		require.Equal(t, reshard.FailpointTargetCommitted, name)
		return died
	}})
	require.ErrorIs(t, err, died)
	both := 0
	for _, shards := range b.where(t) {
		if len(shards) == 2 {
			both++
		}
	}
	require.Positive(t, both, "the interrupted batch is on both shards")

	_, err = reshard.Move(b.ctx, b.pools, reshard.Options{Shards: 2})
	require.NoError(t, err)
	for id, shards := range b.where(t) {
		require.Equal(t, []int{contract.Shard("alpha", id, 2)}, shards, id)
		require.Len(t, b.history(t, shards[0], id), 3, "%s: history copied once", id)
	}
}

// A row a running scheduler holds locked is not moved under it: the move
// waits and takes it once the lock is gone.
func TestMoveWaitsForLockedRows(t *testing.T) {
	t.Parallel()
	b := setup(t, 2, 50)
	var locked string
	for i := range 50 {
		if id := fmt.Sprintf("item-%04d", i); contract.Shard("alpha", id, 2) == 1 {
			locked = id
			break
		}
	}
	tx, err := b.pools[0].Begin(b.ctx)
	require.NoError(t, err)
	_, err = tx.Exec(b.ctx, `SELECT 1 FROM retries WHERE kind = 'alpha' AND item_id = $1 FOR UPDATE`, locked)
	require.NoError(t, err)

	done := make(chan error, 1)
	go func() {
		_, err := reshard.Move(b.ctx, b.pools, reshard.Options{Shards: 2})
		done <- err
	}()
	require.Eventually(t, func() bool {
		w := b.where(t)
		moved := 0
		for id, shards := range w {
			if id != locked && shards[0] == 1 {
				moved++
			}
		}
		return moved > 0 && len(w[locked]) == 1 && w[locked][0] == 0
	}, waitFor, pollEvery, "the others move, the locked row stays")
	select {
	case err := <-done:
		t.Fatalf("move returned with a row left locked: %v", err)
	default:
	}
	require.NoError(t, tx.Rollback(b.ctx))
	require.NoError(t, <-done)
	require.Equal(t, []int{1}, b.where(t)[locked])
}

// Releases are not items: every shard gets the last release of each key
// and the claims of the releases already applied, but not the claim of a
// release still applied in parts.
func TestMoveCopiesReleases(t *testing.T) {
	t.Parallel()
	b := setup(t, 2, 1)
	_, err := b.pools[0].Exec(b.ctx, `INSERT INTO retry_hold_releases (kind, hold_key, hold_reason, released_at) VALUES ('alpha', 'src', '', '2026-11-01T00:00:00Z');
INSERT INTO inbox (consumer, msg_id) VALUES ('scheduler', 'alpha-released:src:1'), ('scheduler', 'alpha-released:src:2'), ('scheduler', 'alpha-failed:x:1');
INSERT INTO retry_release_parts (msg_id, kind, hold_key, release, numbered, after_held_since, after_created_at, after_item_id, next_at)
VALUES ('alpha-released:src:2', 'alpha', 'src', '{}', 0, now(), now(), '', now())`)
	require.NoError(t, err)
	_, err = reshard.Move(b.ctx, b.pools, reshard.Options{Shards: 2})
	require.NoError(t, err)
	var claims []string
	rows, err := b.pools[1].Query(b.ctx, `SELECT msg_id FROM inbox WHERE consumer = 'scheduler' ORDER BY msg_id`)
	require.NoError(t, err)
	for rows.Next() {
		var s string
		require.NoError(t, rows.Scan(&s))
		claims = append(claims, s)
	}
	require.Equal(t, []string{"alpha-released:src:1"}, claims)
	var n int
	require.NoError(t, b.pools[1].QueryRow(b.ctx, `SELECT count(*) FROM retry_hold_releases WHERE kind = 'alpha' AND hold_key = 'src'`).Scan(&n))
	require.Equal(t, 1, n)
}

func TestMoveRefusesWrongDatabaseCount(t *testing.T) {
	t.Parallel()
	_, err := reshard.Move(context.Background(), []*pgxpool.Pool{nil}, reshard.Options{Shards: 2})
	require.ErrorContains(t, err, "1 databases for 2 shards")
}

const (
	waitFor   = 30 * time.Second
	pollEvery = 20 * time.Millisecond
)
