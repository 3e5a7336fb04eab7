package inbox_test

import (
	"context"
	"testing"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgxpool"
	"github.com/stretchr/testify/require"

	"github.com/retryd/retryd/internal/inbox"
	"github.com/retryd/retryd/migrations/pgtest"
)

func TestMain(m *testing.M) { pgtest.Main(m) }

func setup(t *testing.T) *pgxpool.Pool {
	t.Helper()
	return pgtest.NewPool(t)
}

func claim(t *testing.T, pool *pgxpool.Pool, consumer, msgID string) bool {
	t.Helper()
	var first bool
	require.NoError(t, pgx.BeginFunc(context.Background(), pool, func(tx pgx.Tx) error {
		var err error
		first, err = inbox.Claim(context.Background(), tx, consumer, msgID)
		return err
	}))
	return first
}

// firstClaim begins a transaction and claims msgID for consumer in it;
// the claim must be the first. The caller ends the transaction.
func firstClaim(t *testing.T, pool *pgxpool.Pool, consumer, msgID string) pgx.Tx {
	t.Helper()
	tx, err := pool.Begin(context.Background())
	require.NoError(t, err)
	first, err := inbox.Claim(context.Background(), tx, consumer, msgID)
	require.NoError(t, err)
	require.True(t, first)
	return tx
}

func TestClaimOnce(t *testing.T) {
	t.Parallel()
	pool := setup(t)
	require.True(t, claim(t, pool, "scheduler", "event-failed:a:1"))
	require.False(t, claim(t, pool, "scheduler", "event-failed:a:1"), "a redelivery is a duplicate")
	require.True(t, claim(t, pool, "ingress-retry", "event-failed:a:1"), "each consumer claims for itself")
	require.True(t, claim(t, pool, "scheduler", "event-failed:a:2"))
}

func TestRolledBackClaimIsForgotten(t *testing.T) {
	t.Parallel()
	pool := setup(t)
	ctx := context.Background()
	tx := firstClaim(t, pool, "scheduler", "m1")
	require.NoError(t, tx.Rollback(ctx))
	require.True(t, claim(t, pool, "scheduler", "m1"), "the change was not applied, so the redelivery must be")
}

// Two deliveries of the same message handled at the same time: the second
// claim waits for the first transaction and follows its outcome.
func TestConcurrentClaims(t *testing.T) {
	t.Parallel()
	for _, commit := range []bool{true, false} {
		t.Run(map[bool]string{true: "first commits", false: "first rolls back"}[commit], func(t *testing.T) {
			t.Parallel()
			pool := setup(t)
			ctx := context.Background()
			tx1 := firstClaim(t, pool, "c", "m")

			second := make(chan bool, 1)
			go func() {
				var got bool
				err := pgx.BeginFunc(ctx, pool, func(tx pgx.Tx) error {
					var err error
					got, err = inbox.Claim(ctx, tx, "c", "m")
					return err
				})
				if err != nil {
					t.Errorf("second claim: %v", err)
				}
				second <- got
			}()
			// The second claim is blocked on the first transaction's row.
			require.Eventually(t, func() bool {
				return pgtest.Count(t, pool, "SELECT count(*) FROM pg_stat_activity WHERE datname = current_database() AND wait_event_type = 'Lock'") == 1
			}, 10*time.Second, 5*time.Millisecond)
			if commit {
				require.NoError(t, tx1.Commit(ctx))
			} else {
				require.NoError(t, tx1.Rollback(ctx))
			}
			require.Equal(t, !commit, <-second)
		})
	}
}

func TestClaimRejectsEmptyKey(t *testing.T) {
	t.Parallel()
	pool := setup(t)
	ctx := context.Background()
	err := pgx.BeginFunc(ctx, pool, func(tx pgx.Tx) error {
		_, err := inbox.Claim(ctx, tx, "scheduler", "")
		return err
	})
	require.ErrorIs(t, err, inbox.ErrEmptyKey)
	err = pgx.BeginFunc(ctx, pool, func(tx pgx.Tx) error {
		_, err := inbox.Claim(ctx, tx, "", "m")
		return err
	})
	require.ErrorIs(t, err, inbox.ErrEmptyKey)
}

func TestPrune(t *testing.T) {
	t.Parallel()
	pool := setup(t)
	ctx := context.Background()
	// More old claims than one prune batch, and a few recent ones.
	_, err := pool.Exec(ctx, `
		INSERT INTO inbox (consumer, msg_id, applied_at)
		SELECT 'c', 'old-' || i, now() - interval '2 hours' FROM generate_series(1, 12001) i`)
	require.NoError(t, err)
	_, err = pool.Exec(ctx, `
		INSERT INTO inbox (consumer, msg_id, applied_at)
		SELECT 'c', 'new-' || i, now() - interval '30 minutes' FROM generate_series(1, 5) i`)
	require.NoError(t, err)

	n, err := inbox.Prune(ctx, pool, time.Hour)
	require.NoError(t, err)
	require.EqualValues(t, 12001, n)
	require.Equal(t, 5, pgtest.Count(t, pool, "SELECT count(*) FROM inbox WHERE msg_id LIKE 'new-%'"))
	require.Equal(t, 5, pgtest.Count(t, pool, "SELECT count(*) FROM inbox"))

	n, err = inbox.Prune(ctx, pool, time.Hour)
	require.NoError(t, err)
	require.Zero(t, n)
	require.True(t, claim(t, pool, "c", "old-1"), "a pruned claim no longer deduplicates")

	_, err = inbox.Prune(ctx, pool, 0)
	require.Error(t, err)
}

func TestPruneOnlyNamedConsumers(t *testing.T) {
	t.Parallel()
	pool := setup(t)
	ctx := context.Background()
	_, err := pool.Exec(ctx, `
		INSERT INTO inbox (consumer, msg_id, applied_at)
		SELECT c, 'old-' || i, now() - interval '2 hours'
		FROM generate_series(1, 3) i, unnest(ARRAY['mine', 'also-mine', 'theirs']) c`)
	require.NoError(t, err)

	n, err := inbox.Prune(ctx, pool, time.Hour, "mine", "also-mine")
	require.NoError(t, err)
	require.EqualValues(t, 6, n)
	require.Equal(t, 3, pgtest.Count(t, pool, "SELECT count(*) FROM inbox WHERE consumer = 'theirs'"), "another service's claims are kept")
}

func TestClaimMany(t *testing.T) {
	t.Parallel()
	pool := setup(t)
	ctx := context.Background()
	require.True(t, claim(t, pool, "scheduler", "b"))
	var got map[string]bool
	require.NoError(t, pgx.BeginFunc(ctx, pool, func(tx pgx.Tx) error {
		var err error
		got, err = inbox.ClaimMany(ctx, tx, "scheduler", []string{"a", "b", "a", "c"})
		return err
	}))
	require.Equal(t, map[string]bool{"a": true, "c": true}, got, "b was claimed before; a twice in one call counts once")
	require.False(t, claim(t, pool, "scheduler", "c"))

	require.NoError(t, pgx.BeginFunc(ctx, pool, func(tx pgx.Tx) error {
		_, err := inbox.ClaimMany(ctx, tx, "scheduler", []string{"d", ""})
		require.ErrorIs(t, err, inbox.ErrEmptyKey)
		return nil
	}))
}
