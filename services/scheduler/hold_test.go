package scheduler_test

import (
	"encoding/json"
	"fmt"
	"testing"
	"time"

	"github.com/nats-io/nats.go"
	"github.com/nats-io/nats.go/jetstream"
	"github.com/stretchr/testify/require"

	"github.com/retryd/retryd/migrations/pgtest"
	"github.com/retryd/retryd/pkg/contract"
	"github.com/retryd/retryd/pkg/policy"
	"github.com/retryd/retryd/services/scheduler"
	"github.com/retryd/retryd/stores/retrystore"
)

func held(kind, id string, attempt int, reason string, until *time.Time) contract.HeldData {
	return contract.HeldData{Kind: kind, ID: id, Attempt: attempt, Reason: reason, Until: until, Source: "src",
		Payload: json.RawMessage(`{"n":1}`)}
}

// heldUnder is held for attempt 1, held under key.
func heldUnder(key, kind, id, reason string, until *time.Time) contract.HeldData {
	hd := held(kind, id, 1, reason, until)
	hd.HoldKey = key
	return hd
}

func at(d time.Duration) *time.Time { t := time.Now().Add(d); return &t }

func decisionOf(t *testing.T, h retrystore.HistoryEntry) contract.Decision {
	t.Helper()
	var d contract.Decision
	require.NoError(t, json.Unmarshal(h.Detail, &d))
	return d
}

// An item held again and again, far longer than its whole retry budget
// would last and past the max delay each time, is never exhausted and
// keeps every retry: a hold is not a failure.
func TestHoldsKeepTheBudgetAndAreNotCappedByMaxDelay(t *testing.T) {
	t.Parallel()
	b := setup(t)
	b.start(t)
	b.policy(t, "hold", "", 2, 10, 100)

	for attempt := 1; attempt <= 6; attempt++ {
		b.publish(t, contract.Held, held("hold", "h1", attempt, contract.HoldThrottle, at(300*time.Millisecond)))
		row := b.waitRow(t, "hold", "h1", inState(retrystore.StateDue, attempt+1))
		require.Zero(t, row.RetryCount, "attempt %d", attempt)
		require.Equal(t, contract.HoldThrottle, row.HoldReason)
	}
	// The item runs and fails: its first retry of two is used now.
	row := b.failTo(t, "hold", "h1", 7, "timeout", retrystore.StateDue)
	require.Equal(t, 1, row.RetryCount)
	require.Nil(t, row.HeldSince, "an attempt ran: the hold ended")

	h := b.history(t, "hold", "h1")
	var holds int
	for _, e := range h {
		if e.Event == string(contract.Scheduled) || e.Event == string(contract.Rescheduled) {
			d := decisionOf(t, e)
			if d.HoldReason == "" {
				require.Equal(t, contract.DecidedByBackoff, d.DecidedBy)
				continue
			}
			holds++
			require.Equal(t, contract.DecidedByHold, d.DecidedBy)
			require.Zero(t, d.RetryCount)
			require.Greater(t, d.DelayMS, int64(100), "not capped at the max delay")
			require.NotNil(t, d.HeldSince)
		}
	}
	require.Equal(t, 6, holds)
	for _, m := range b.streamMsgs(t, "retry.hold.exhausted.h1") {
		t.Fatalf("exhausted: %s", m.Data())
	}
}

// A pause with an end is released at its end, not capped at max delay.
func TestPauseUntilIsTheReleaseTime(t *testing.T) {
	t.Parallel()
	b := setup(t)
	b.start(t)
	b.policy(t, "pu", "", 2, 10, 100)
	until := time.Now().Add(time.Hour).UTC().Truncate(time.Millisecond)
	b.publish(t, contract.Held, held("pu", "p1", 1, contract.HoldPause, &until))
	row := b.waitRow(t, "pu", "p1", inState(retrystore.StateScheduled, 2))
	require.NotNil(t, row.NextAttemptAt)
	require.True(t, row.NextAttemptAt.Equal(until), "due at %s, want %s", row.NextAttemptAt, until)
	d := decisionOf(t, b.history(t, "pu", "p1")[1])
	require.Equal(t, contract.DecidedByPauseUntil, d.DecidedBy)
	require.Equal(t, contract.HoldPause, d.HoldReason)

	// A pause without an end waits for a release, until max_hold.
	b.publish(t, contract.Held, held("pu", "p2", 1, contract.HoldPause, nil))
	row = b.waitRow(t, "pu", "p2", inState(retrystore.StateScheduled, 2))
	require.WithinDuration(t, row.HeldSince.Add(30*24*time.Hour), *row.NextAttemptAt, time.Millisecond)
	require.Equal(t, contract.DecidedByPause, decisionOf(t, b.history(t, "pu", "p2")[1]).DecidedBy)
}

// Held past the policy's max_hold, an item is exhausted as hold_expired,
// and the exhausted event says so.
func TestHoldExpiresAfterMaxHold(t *testing.T) {
	t.Parallel()
	b := setup(t)
	s := b.start(t)
	b.policy(t, "hx", "", 2, 10, 100, func(p *policy.Policy) { p.MaxHold = 300 * time.Millisecond })

	b.publish(t, contract.Held, held("hx", "x1", 1, contract.HoldPause, nil))
	row := b.waitRow(t, "hx", "x1", inState(retrystore.StateDue, 2))
	require.WithinDuration(t, row.HeldSince.Add(300*time.Millisecond), *row.NextAttemptAt, time.Millisecond)
	// Still paused when it comes due: the owner holds it again.
	b.publish(t, contract.Held, held("hx", "x1", 2, contract.HoldPause, nil))
	row = b.waitRow(t, "hx", "x1", inState(retrystore.StateExhausted, 2))
	require.Equal(t, contract.ExhaustedHoldExpired, row.ExhaustedReason)
	require.Zero(t, row.RetryCount)

	var msgs []*contract.ExhaustedData
	require.Eventually(t, func() bool {
		msgs = nil
		for _, m := range b.streamMsgs(t, "retry.hx.exhausted.x1") {
			ev, err := contract.DecodeLifecycle(m.Subject(), m.Data())
			require.NoError(t, err)
			msgs = append(msgs, ev.Exhausted)
		}
		return len(msgs) == 1
	}, waitFor, 10*time.Millisecond)
	require.Equal(t, contract.ExhaustedHoldExpired, msgs[0].Reason)
	require.Contains(t, msgs[0].Error.Message, "max_hold")
	require.Equal(t, 1.0, metric(t, s.reg, "retryd_scheduler_exhausted_total", "kind", "hx"))
	require.Equal(t, 1.0, metric(t, s.reg, "retryd_scheduler_exhausted_by_class_total", "kind", "hx", "class", "none", "reason", "hold_expired"))
}

// The same hold delivered twice, or republished after the duplicate
// window, changes nothing the second time.
func TestDuplicateHoldChangesNothing(t *testing.T) {
	t.Parallel()
	b := setup(t)
	s := b.start(t)
	shrinkDuplicateWindow(t, b, time.Second)
	b.policy(t, "hdup", "", 2, 10, 100)

	msg := lifecycleMsg(t, contract.Held, held("hdup", "d1", 1, contract.HoldThrottle, at(time.Hour)))
	_, err := b.js.PublishMsg(b.ctx, msg)
	require.NoError(t, err)
	before := b.waitRow(t, "hdup", "d1", inState(retrystore.StateScheduled, 2))
	again, err := b.js.PublishMsg(b.ctx, msg)
	require.NoError(t, err)
	require.True(t, again.Duplicate)
	b.storeAgain(t, msg)

	waitMetric(t, s.reg, 1, "retryd_scheduler_duplicate_total", "consumer", "scheduler")
	b.waitQuiet(t)
	after, err := retrystore.Get(b.ctx, b.pool, "hdup", "d1")
	require.NoError(t, err)
	before.UpdatedAt, after.UpdatedAt = time.Time{}, time.Time{}
	require.Equal(t, before, after)
	require.Equal(t, []string{"held:1", "scheduled:2"}, events(b.history(t, "hdup", "d1")))
	require.Len(t, b.streamMsgs(t, "retry.hdup.scheduled.d1"), 1)
}

// Malformed holds and releases are terminated and counted, and change
// nothing.
func TestMalformedHoldIsTerminatedAndCounted(t *testing.T) {
	t.Parallel()
	b := setup(t)
	s := b.start(t)
	env := func(typ, data string) []byte {
		return fmt.Appendf(nil, `{"specversion":"1.0","id":"x1","source":"test","type":%q,"time":"2026-01-01T00:00:00Z","data":%s}`, typ, data)
	}
	bad := []struct{ subject, body string }{
		{"retry.hm.held.m1", `{"kind":"hm","id":"m1","attempt":1,"reason":"nap"}`},
		{"retry.hm.held.m2", `{"kind":"hm","id":"m2","attempt":0,"reason":"pause"}`},
		{"retry.hm.held.m3", `{"kind":"hm","id":"m3","attempt":1,"reason":"pause","until":"soon"}`},
		{"retry.hm.held.m4", `{"kind":"hm","id":"m4","attempt":1,"reason":"pause","extra":true}`},
		{"retry.hm.released.k1", `{"kind":"hm","hold_key":"k1","reason":"resume"}`},
	}
	for i, c := range bad {
		typ := "retry.held"
		if i == len(bad)-1 {
			typ = "retry.released"
		}
		m := nats.NewMsg(c.subject)
		m.Data = env(typ, c.body)
		m.Header.Set(contract.HeaderMsgID, fmt.Sprintf("bad-%d", i))
		_, err := b.js.PublishMsg(b.ctx, m)
		require.NoError(t, err)
	}
	waitMetric(t, s.reg, float64(len(bad)), "retryd_scheduler_malformed_total", "consumer", "scheduler")
	b.waitQuiet(t)
	require.Zero(t, pgtest.Count(t, b.pool, `SELECT count(*) FROM retries WHERE kind = 'hm'`))
}

// pauseHeld holds attempt 1 of n items of kind (ids idFormat of 0 to
// n-1) paused under key, one after the other: the order they were held
// in is their order.
func (b *bundle) pauseHeld(t *testing.T, kind, key, idFormat string, n int) {
	t.Helper()
	for i := range n {
		hd := heldUnder(key, kind, fmt.Sprintf(idFormat, i), contract.HoldPause, nil)
		b.publish(t, contract.Held, hd)
		b.waitRow(t, kind, hd.ID, inState(retrystore.StateScheduled, 2))
	}
}

// A release makes every pause hold under its key due at once, in the
// order the items were first held; a hold decided before the release but
// applied after it is released too. Throttle holds and other keys stay.
// The release is applied in parts of 3 (one in the fact's transaction,
// the rest by the release loop): the order holds across parts.
func TestReleaseLiftsPauseHoldsInOrder(t *testing.T) {
	t.Parallel()
	b := setup(t)
	b.start(t, func(c *scheduler.Config) { c.ReleasePart = 3 }) // 7 parts, in order
	b.policy(t, "rel", "", 2, 10, 100)
	const n = 20
	b.pauseHeld(t, "rel", "shop", "r%02d", n)
	other := heldUnder("partner", "rel", "other", contract.HoldPause, nil)
	b.publish(t, contract.Held, other)
	throttled := heldUnder("shop", "rel", "throttled", contract.HoldThrottle, at(time.Hour))
	b.publish(t, contract.Held, throttled)
	b.waitRow(t, "rel", "throttled", inState(retrystore.StateScheduled, 2))
	b.waitRow(t, "rel", "other", inState(retrystore.StateScheduled, 2))

	// Decided (by the owner) before the resume, published after it.
	late := heldUnder("shop", "rel", "late", contract.HoldPause, nil)
	lateMsg := lifecycleMsg(t, contract.Held, late)
	b.publish(t, contract.Released, contract.ReleasedData{Kind: "rel", HoldKey: "shop", Reason: contract.ReleaseResume, By: "test", ReleasedAt: time.Now()})

	var dues []string
	require.Eventually(t, func() bool {
		dues = nil
		for _, m := range b.streamMsgs(t, "retry.rel.due.*") {
			dues = append(dues, decodeDue(t, m).ID)
		}
		return len(dues) == n+1
	}, waitFor, 10*time.Millisecond)
	for i, id := range dues[:n] {
		require.Equal(t, fmt.Sprintf("r%02d", i), id, "released in the order first held")
	}
	require.Equal(t, "throttled", dues[n])
	// The due loop commits its history row just after it publishes.
	var h []retrystore.HistoryEntry
	require.Eventually(t, func() bool {
		h = b.history(t, "rel", "r00")
		return len(h) == 4
	}, waitFor, 10*time.Millisecond)
	require.Equal(t, []string{"held:1", "scheduled:2", "rescheduled:2", "due:2"}, events(h))
	require.Equal(t, contract.DecidedByResume, h[2].DecidedBy)

	_, err := b.js.PublishMsg(b.ctx, lateMsg)
	require.NoError(t, err)
	b.waitRow(t, "rel", "late", inState(retrystore.StateDue, 2))
	require.Equal(t, contract.DecidedByResume, decisionOf(t, b.history(t, "rel", "late")[1]).DecidedBy)

	b.waitQuiet(t)
	row, err := retrystore.Get(b.ctx, b.pool, "rel", "other")
	require.NoError(t, err)
	require.Equal(t, retrystore.StateScheduled, row.State)
}

// A paced release brings each held item back at its slot of the owner's
// rate limit, in the order first held: one due per item, never more than
// the limit in a window, and a held row whose time had come is paced too.
func TestPacedReleaseBringsEachHoldBackAtItsSlot(t *testing.T) {
	t.Parallel()
	b := setup(t)
	b.start(t, func(c *scheduler.Config) { c.ReleasePart = 5 }) // each part ranks on from the last
	b.policy(t, "pace", "", 2, 10, 100)
	const n = 12
	b.pauseHeld(t, "pace", "shop", "p%02d", n)
	// 4 per 200 ms from the next whole second, one slot of its first
	// window taken: 12 items over 4 windows, at the start of the 10 ms
	// that hold their slots.
	from := time.Now().Truncate(time.Second).Add(time.Second)
	pace := &contract.ReleasePace{From: from, Skip: 1, Limit: 4, WindowMS: 200}
	b.publish(t, contract.Released, contract.ReleasedData{Kind: "pace", HoldKey: "shop", Reason: contract.ReleaseResume,
		By: "test", ReleasedAt: time.Now(), Pace: pace})

	for i := range n {
		id := fmt.Sprintf("p%02d", i)
		r := b.waitRow(t, "pace", id, func(r retrystore.Retry) bool {
			return r.NextAttemptAt != nil && r.NextAttemptAt.Equal(pace.DueAt(i))
		})
		require.Zero(t, r.RetryCount, "%s: a release spends no retry", id)
	}
	var dues []jetstream.Msg
	require.Eventually(t, func() bool {
		dues = b.streamMsgs(t, "retry.pace.due.*")
		return len(dues) == n
	}, waitFor, 10*time.Millisecond)
	for i, m := range dues {
		d := decodeDue(t, m)
		require.Equal(t, fmt.Sprintf("p%02d", i), d.ID, "due in the order first held")
		md, err := m.Metadata()
		require.NoError(t, err)
		require.False(t, md.Timestamp.Before(pace.DueAt(i)), "%s published at %s, before its time %s", d.ID, md.Timestamp, pace.DueAt(i))
	}
	h := b.history(t, "pace", "p05")
	require.Equal(t, contract.DecidedByResume, h[2].DecidedBy)
	require.Contains(t, string(h[2].Detail), "at its slot of 4 per 200ms")
	b.waitQuiet(t)
	require.Len(t, b.streamMsgs(t, "retry.pace.due.*"), n, "one due per item")
}

// A release fact the scheduler applies after a hold the owner decided
// after the release (the facts race on RETRIES) leaves that hold alone:
// only holds that began at or before released_at come due.
func TestReleaseLeavesHoldsDecidedAfterIt(t *testing.T) {
	t.Parallel()
	b := setup(t)
	b.start(t)
	b.policy(t, "after", "", 2, 10, 100)
	releasedAt := time.Now()
	time.Sleep(2 * time.Millisecond) // the hold's envelope time is later than the release
	hd := heldUnder("shop", "after", "later", contract.HoldThrottle, at(time.Hour))
	b.publish(t, contract.Held, hd)
	b.waitRow(t, "after", "later", inState(retrystore.StateScheduled, 2))
	b.publish(t, contract.Released, contract.ReleasedData{Kind: "after", HoldKey: "shop", Reason: contract.ReleaseLimitChanged,
		By: "test", ReleasedAt: releasedAt})
	b.waitQuiet(t)
	row, err := retrystore.Get(b.ctx, b.pool, "after", "later")
	require.NoError(t, err)
	require.Equal(t, retrystore.StateScheduled, row.State)
	require.True(t, row.NextAttemptAt.After(time.Now().Add(50*time.Minute)), "still held until its own time: %s", row.NextAttemptAt)
	require.Empty(t, b.streamMsgs(t, "retry.after.due.*"))
}

// A release whose owner admits the items itself (owner_admits) brings no
// due at the slot and writes nothing on the rows at first: the owner's
// succeeded closes each row and records the release (decided_by resume).
// Half of RedueAfter after the slots the release runs behind the owner:
// an item the owner never answered for gets a fallback due, RedueAfter
// after its slot, and comes back then.
func TestOwnerAdmittedReleaseEmitsOnlyFallbackDues(t *testing.T) {
	t.Parallel()
	b := setup(t)
	s := b.start(t)
	b.policy(t, "own", "", 2, 10, 100)
	for _, id := range []string{"o1", "o2"} {
		hd := heldUnder("shop", "own", id, contract.HoldPause, nil)
		b.publish(t, contract.Held, hd)
		b.waitRow(t, "own", id, inState(retrystore.StateScheduled, 2))
	}
	released := time.Now()
	b.publish(t, contract.Released, contract.ReleasedData{Kind: "own", HoldKey: "shop", Reason: contract.ReleaseResume,
		By: "test", ReleasedAt: released, OwnerAdmits: true})
	var behind time.Time
	require.Eventually(t, func() bool {
		return b.pool.QueryRow(b.ctx, `SELECT next_at FROM retry_release_parts WHERE kind = 'own' AND behind`).Scan(&behind) == nil
	}, waitFor, 10*time.Millisecond, "the release waits behind the owner")
	require.WithinDuration(t, released.Add(scheduler.DefaultRedueAfter/2), behind, 10*time.Second)
	require.Eventually(t, func() bool { return metric(t, s.reg, "retryd_scheduler_releases_pending") == 1 }, waitFor, 10*time.Millisecond)

	// The owner admits o1: the close records the release.
	b.publish(t, contract.Succeeded, contract.SucceededData{Kind: "own", ID: "o1", Attempt: 2})
	b.waitRow(t, "own", "o1", inState(retrystore.StateSucceeded, 2))
	h := b.history(t, "own", "o1")
	require.Equal(t, []string{"held:1", "scheduled:2", "succeeded:2"}, events(h))
	require.Equal(t, contract.DecidedByResume, h[2].DecidedBy)
	require.Contains(t, string(h[2].Detail), "after a release of the hold")
	o2, err := retrystore.Get(b.ctx, b.pool, "own", "o2")
	require.NoError(t, err)
	require.True(t, o2.NextAttemptAt.After(released.Add(24*time.Hour)), "nothing written on o2 yet: %s", o2.NextAttemptAt)

	// o2's answer never comes. The part behind the owner comes (brought
	// forward here) and gives o2 its fallback.
	_, err = b.pool.Exec(b.ctx, `UPDATE retry_release_parts SET next_at = now() WHERE kind = 'own'`)
	require.NoError(t, err)
	r := b.waitRow(t, "own", "o2", func(r retrystore.Retry) bool {
		return r.NextAttemptAt != nil && r.NextAttemptAt.Before(released.Add(time.Hour))
	})
	require.WithinDuration(t, time.Now().Add(scheduler.DefaultRedueAfter), *r.NextAttemptAt, 10*time.Second, "a fallback, RedueAfter after the owner's time")
	require.Zero(t, r.RetryCount)
	h = b.history(t, "own", "o2")
	require.Equal(t, contract.DecidedByResume, h[len(h)-1].DecidedBy)
	require.Contains(t, string(h[len(h)-1].Detail), "owner_admits_at")
	require.Empty(t, b.streamMsgs(t, "retry.own.due.*"), "no due at the slot")
	require.Eventually(t, func() bool { return b.releasePartsLeft(t) == 0 }, waitFor, 10*time.Millisecond)
	require.Eventually(t, func() bool { return metric(t, s.reg, "retryd_scheduler_releases_pending") == 0 }, waitFor, 10*time.Millisecond)

	_, err = b.pool.Exec(b.ctx, `UPDATE retries SET next_attempt_at = now() WHERE kind = 'own' AND item_id = 'o2'`)
	require.NoError(t, err)
	var dues []jetstream.Msg
	require.Eventually(t, func() bool {
		dues = b.streamMsgs(t, "retry.own.due.*")
		return len(dues) == 1
	}, waitFor, 10*time.Millisecond, "the fallback due of the item nobody answered for")
	require.Equal(t, "o2", decodeDue(t, dues[0]).ID)
	b.waitQuiet(t)
	require.Len(t, b.streamMsgs(t, "retry.own.due.*"), 1, "no due for the item the owner admitted")
}

// A release the owner admits, over holds that would come due on their own
// before a part behind the owner ran (a pause ending in a minute), is
// applied ahead instead: each row gets its fallback at once and does not
// come due at the pause's end.
func TestOwnerAdmittedReleaseOfHoldsEndingSoonRunsAhead(t *testing.T) {
	t.Parallel()
	b := setup(t)
	b.start(t)
	b.policy(t, "soon", "", 2, 10, 100)
	b.publish(t, contract.Held, heldUnder("shop", "soon", "e1", contract.HoldPause, at(time.Minute)))
	b.waitRow(t, "soon", "e1", inState(retrystore.StateScheduled, 2))
	released := time.Now()
	b.publish(t, contract.Released, contract.ReleasedData{Kind: "soon", HoldKey: "shop", Reason: contract.ReleaseResume,
		By: "test", ReleasedAt: released, OwnerAdmits: true})
	r := b.waitRow(t, "soon", "e1", func(r retrystore.Retry) bool {
		return r.NextAttemptAt != nil && r.NextAttemptAt.After(released.Add(2*time.Minute))
	})
	require.WithinDuration(t, released.Add(scheduler.DefaultRedueAfter), *r.NextAttemptAt, 10*time.Second)
	require.Zero(t, b.releasePartsLeft(t))
}

// The owner's succeeded right behind its release, in one batch (the owner
// admits the items as soon as it released them): the release still
// applies first, in stream order, so each row records its release
// (decided_by resume) before the succeeded closes it.
func TestReleaseAppliesBeforeTheSucceededBehindIt(t *testing.T) {
	t.Parallel()
	b := setup(t)
	first := b.start(t)
	b.policy(t, "seq", "", 2, 10, 100)
	ids := []string{"s1", "s2", "s3"}
	for _, id := range ids {
		b.publish(t, contract.Held, heldUnder("shop", "seq", id, contract.HoldPause, nil))
		b.waitRow(t, "seq", id, inState(retrystore.StateScheduled, 2))
	}
	b.stop(t, first)

	// Both on the stream while no scheduler runs: the next one takes them
	// in one batch.
	b.publish(t, contract.Released, contract.ReleasedData{Kind: "seq", HoldKey: "shop", Reason: contract.ReleaseResume,
		By: "test", ReleasedAt: time.Now(), OwnerAdmits: true})
	for _, id := range ids {
		b.publish(t, contract.Succeeded, contract.SucceededData{Kind: "seq", ID: id, Attempt: 2})
	}
	b.start(t)
	for _, id := range ids {
		b.waitRow(t, "seq", id, inState(retrystore.StateSucceeded, 2))
		var decided []string
		for _, h := range b.history(t, "seq", id) {
			decided = append(decided, string(h.DecidedBy))
		}
		require.Contains(t, decided, string(contract.DecidedByResume), "%s: its release is in its history: %v", id, decided)
	}
}
