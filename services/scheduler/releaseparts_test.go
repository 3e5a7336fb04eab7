package scheduler_test

import (
	"context"
	"fmt"
	"sync/atomic"
	"testing"
	"time"

	"github.com/nats-io/nats.go/jetstream"
	"github.com/stretchr/testify/require"

	"github.com/retryd/retryd/migrations/pgtest"
	"github.com/retryd/retryd/pkg/contract"
	"github.com/retryd/retryd/services/scheduler"
	"github.com/retryd/retryd/stores/retrystore"
)

// resumeEntries counts the rescheduled history entries a release gave id.
func (b *bundle) resumeEntries(t *testing.T, kind, id string) int {
	t.Helper()
	n := 0
	for _, h := range b.history(t, kind, id) {
		if h.DecidedBy == contract.DecidedByResume {
			n++
		}
	}
	return n
}

func (b *bundle) releasePartsLeft(t *testing.T) int {
	t.Helper()
	return pgtest.Count(t, b.pool, `SELECT count(*) FROM retry_release_parts`)
}

// The process dies while a release is applied in parts: the part in the
// fact's transaction is kept, the part whose transaction never committed
// is not. The next scheduler applies the rest from where the release
// stopped: every held row is released once, at its own slot (ranked on
// from the last part), and comes due once.
func TestReleasePartsResumeAfterACrash(t *testing.T) {
	t.Parallel()
	b := setup(t)
	crashed := make(chan struct{})
	var once atomic.Bool
	a := b.start(t, func(c *scheduler.Config) {
		c.ReleasePart = 3
		c.Failpoint = failAt(scheduler.FailpointReleasePart, func(context.Context) error {
			if once.CompareAndSwap(false, true) {
				close(crashed)
			}
			return errCrash
		})
	})
	b.policy(t, "parts", "", 2, 10, 100)
	const n = 10
	b.pauseHeld(t, "parts", "shop", "p%02d", n)
	// Paced from now, the scheduler emitting the dues: every part is due
	// at once (a second before its slots).
	pace := &contract.ReleasePace{From: time.Now().Truncate(time.Second), Limit: 4, WindowMS: 200}
	b.publish(t, contract.Released, contract.ReleasedData{Kind: "parts", HoldKey: "shop", Reason: contract.ReleaseLimitChanged,
		By: "test", ReleasedAt: time.Now(), Pace: pace})
	<-crashed
	b.stop(t, a)
	for i := range n {
		want := 0
		if i < 3 {
			want = 1
		}
		require.Equal(t, want, b.resumeEntries(t, "parts", fmt.Sprintf("p%02d", i)), "p%02d: only the first part committed", i)
	}
	require.Equal(t, 1, b.releasePartsLeft(t), "where the release stopped is kept")

	b.start(t, func(c *scheduler.Config) { c.ReleasePart = 3 })
	require.Eventually(t, func() bool { return b.releasePartsLeft(t) == 0 }, waitFor, 10*time.Millisecond)
	for i := range n {
		id := fmt.Sprintf("p%02d", i)
		var resumed []retrystore.HistoryEntry
		for _, h := range b.history(t, "parts", id) {
			if h.DecidedBy == contract.DecidedByResume {
				resumed = append(resumed, h)
			}
		}
		require.Len(t, resumed, 1, "%s: released once", id)
		require.True(t, resumed[0].NextAttemptAt.Equal(pace.DueAt(i)), "%s: at its own slot %s, got %s", id, pace.DueAt(i), resumed[0].NextAttemptAt)
	}
	var dues []jetstream.Msg
	require.Eventually(t, func() bool {
		dues = b.streamMsgs(t, "retry.parts.due.*")
		return len(dues) == n
	}, waitFor, 10*time.Millisecond)
	requireEachOnce(t, dues, n)
}

// A second release of every hold of a key drops the parts left of the
// first: it ranks those rows itself, and the first would otherwise rewrite
// them part by part at its own slots.
func TestReleaseSupersedesThePartsLeftOfAnEarlierOne(t *testing.T) {
	t.Parallel()
	b := setup(t)
	b.start(t, func(c *scheduler.Config) { c.ReleasePart = 2 })
	b.policy(t, "super", "", 2, 10, 100)
	const n = 6
	b.pauseHeld(t, "super", "shop", "s%02d", n)

	// Paced an hour out: the first part now, the next ones in an hour.
	slow := &contract.ReleasePace{From: time.Now().Truncate(time.Second).Add(time.Hour), Limit: 1, WindowMS: 1000}
	b.publish(t, contract.Released, contract.ReleasedData{Kind: "super", HoldKey: "shop", Reason: contract.ReleaseLimitChanged,
		By: "test", ReleasedAt: time.Now(), Pace: slow})
	b.waitRow(t, "super", "s01", func(r retrystore.Retry) bool { return r.NextAttemptAt != nil && r.NextAttemptAt.Equal(slow.DueAt(1)) })
	require.Equal(t, 1, b.releasePartsLeft(t))

	b.publish(t, contract.Released, contract.ReleasedData{Kind: "super", HoldKey: "shop", Reason: contract.ReleaseResume,
		By: "test", ReleasedAt: time.Now()})
	var dues []string
	require.Eventually(t, func() bool {
		dues = nil
		for _, m := range b.streamMsgs(t, "retry.super.due.*") {
			dues = append(dues, decodeDue(t, m).ID)
		}
		return len(dues) == n
	}, waitFor, 10*time.Millisecond)
	for i, id := range dues {
		require.Equal(t, fmt.Sprintf("s%02d", i), id, "due at once, in the order first held")
	}
	// The second release's own row goes once a part finds no rows left,
	// which may come after the last due; the first's, had it not been
	// dropped, would wait an hour for its next part.
	require.Eventually(t, func() bool { return b.releasePartsLeft(t) == 0 }, waitFor, 10*time.Millisecond,
		"the first release's parts were dropped")
}

// A recorded release whose data does not decode (a row written by hand,
// a bad restore) is dropped and counted; it does not hold up the release
// behind it, which is applied.
func TestMalformedReleasePartIsDroppedNotBlocking(t *testing.T) {
	t.Parallel()
	b := setup(t)
	s := b.start(t, func(c *scheduler.Config) { c.ReleasePart = 2 })
	b.policy(t, "badpart", "", 2, 10, 100)
	const n = 5
	b.pauseHeld(t, "badpart", "shop", "b%02d", n)
	_, err := b.pool.Exec(b.ctx, `INSERT INTO retry_release_parts (msg_id, kind, hold_key, release, numbered,
	after_held_since, after_created_at, after_item_id, next_at)
VALUES ('bad-1', 'badpart', 'other', '{"kind": 7}', 0, now(), now(), '', now() - interval '1 hour')`)
	require.NoError(t, err)

	b.publish(t, contract.Released, contract.ReleasedData{Kind: "badpart", HoldKey: "shop", Reason: contract.ReleaseResume,
		By: "test", ReleasedAt: time.Now()})
	// No parts left is not enough: the release loop may drop the
	// malformed part before the fact is applied and records its own (CI
	// run V read b02 unreleased so). Wait for every row's release.
	require.Eventually(t, func() bool {
		for i := range n {
			if b.resumeEntries(t, "badpart", fmt.Sprintf("b%02d", i)) == 0 {
				return false
			}
		}
		return b.releasePartsLeft(t) == 0
	}, waitFor, 10*time.Millisecond)
	for i := range n {
		require.Equal(t, 1, b.resumeEntries(t, "badpart", fmt.Sprintf("b%02d", i)), "b%02d: released once", i)
	}
	require.Equal(t, 1.0, metric(t, s.reg, "retryd_scheduler_malformed_total", "consumer", "release"))
}

// The same release fact stored twice (republished past the duplicate
// window) is applied once: one set of parts, one release of each row.
func TestDuplicateReleaseIsAppliedOnce(t *testing.T) {
	t.Parallel()
	b := setup(t)
	s := b.start(t, func(c *scheduler.Config) { c.ReleasePart = 2 })
	shrinkDuplicateWindow(t, b, time.Second)
	b.policy(t, "duprel", "", 2, 10, 100)
	const n = 5
	b.pauseHeld(t, "duprel", "shop", "d%02d", n)
	msg := lifecycleMsg(t, contract.Released, contract.ReleasedData{Kind: "duprel", HoldKey: "shop", Reason: contract.ReleaseResume,
		By: "test", ReleasedAt: time.Now()})
	_, err := b.js.PublishMsg(b.ctx, msg)
	require.NoError(t, err)
	b.storeAgain(t, msg)
	require.Eventually(t, func() bool {
		return metric(t, s.reg, "retryd_scheduler_duplicate_total", "consumer", "scheduler") == 1
	}, waitFor, 10*time.Millisecond, "the second copy is recognised")
	require.Eventually(t, func() bool { return b.releasePartsLeft(t) == 0 }, waitFor, 10*time.Millisecond)
	for i := range n {
		require.Equal(t, 1, b.resumeEntries(t, "duprel", fmt.Sprintf("d%02d", i)), "d%02d: released once", i)
	}
	var dues []jetstream.Msg
	require.Eventually(t, func() bool {
		dues = b.streamMsgs(t, "retry.duprel.due.*")
		return len(dues) == n
	}, waitFor, 10*time.Millisecond)
	b.waitQuiet(t)
	requireEachOnce(t, b.streamMsgs(t, "retry.duprel.due.*"), n)
}
