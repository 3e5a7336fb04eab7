package scheduler_test

import (
	"encoding/json"
	"fmt"
	"github.com/prometheus/client_golang/prometheus"
	"strings"
	"testing"
	"time"

	"github.com/stretchr/testify/require"

	"github.com/retryd/retryd/pkg/contract"
	"github.com/retryd/retryd/services/scheduler"
	"github.com/retryd/retryd/stores/retrystore"
)

// A row whose due event cannot be built (here: a payload and a checkpoint
// together larger than any stream accepts) is set aside with its reason,
// no emission counted and no history, while the rest of its batch and of
// the burst around it is emitted. It stays visible as scheduled, and the
// due loop does not claim it again at every pass.
func TestUnbuildableDueIsParked(t *testing.T) {
	t.Parallel()
	b := setup(t)
	past := time.Now().Add(-time.Minute)
	// Each within the 512 KiB cap of its own; together over the 1 MiB
	// envelope.
	big := json.RawMessage(`"` + strings.Repeat("x", contract.MaxDataBytes-2) + `"`)
	const n = 9
	for i := range n {
		r := retrystore.Retry{
			Kind: "rel", ItemID: fmt.Sprintf("r%d", i), State: retrystore.StateScheduled, Attempt: 2,
			MaxRetries: 3, RetryEnabled: true, PolicyName: "default", PolicyVersion: 1,
		}
		at := past.Add(time.Duration(i) * time.Millisecond)
		r.NextAttemptAt = &at
		if i == 4 {
			r.Payload, r.Checkpoint = big, big
		}
		_, err := retrystore.Save(b.ctx, b.pool, r)
		require.NoError(t, err)
	}
	// Batches of 2 make the backlog a burst with concurrent emitters.
	s := b.start(t, func(c *scheduler.Config) { c.BatchSize = 2; c.Emitters = 3 })

	for i := range n {
		if i == 4 {
			continue
		}
		row := b.waitRow(t, "rel", fmt.Sprintf("r%d", i), inState(retrystore.StateDue, 2))
		require.Equal(t, 1, row.DueEmissions)
		require.Equal(t, []string{"due:2"}, events(b.history(t, "rel", row.ItemID)))
	}
	parked := b.waitRow(t, "rel", "r4", func(r retrystore.Retry) bool { return r.LastReason != "" })
	require.Equal(t, retrystore.StateScheduled, parked.State)
	require.Zero(t, parked.DueEmissions)
	require.Nil(t, parked.DueAt)
	require.Contains(t, parked.LastReason, "due event not built")
	require.Contains(t, parked.LastReason, "more than the limit")
	require.WithinDuration(t, time.Now().Add(5*time.Minute), *parked.NextAttemptAt, time.Minute, "set aside for RedueAfter")
	require.Empty(t, b.history(t, "rel", "r4"))
	require.Len(t, b.streamMsgs(t, "retry.rel.due.*"), n-1)
	require.Equal(t, float64(1), metric(t, s.reg, "retryd_scheduler_errors_total", "stage", "due"), "counted once, not at every pass")
}

// A backlog drained by concurrent emitters in ranges, with many rows due
// at the very same instant (as when a throttle window opens) and two
// instances at once: every row comes due once, none is left behind.
func TestBurstWithTiesEmitsEachOnce(t *testing.T) {
	t.Parallel()
	b := setup(t)
	same := time.Now().Add(-30 * time.Second)
	const n = 240
	for i := range n {
		at := same
		if i%3 == 0 {
			at = same.Add(time.Duration(i) * time.Millisecond)
		}
		r := retrystore.Retry{
			Kind: "ties", ItemID: fmt.Sprintf("t%03d", i), State: retrystore.StateScheduled, Attempt: 2,
			MaxRetries: 3, RetryEnabled: true, PolicyName: "default", PolicyVersion: 1, NextAttemptAt: &at,
		}
		_, err := retrystore.Save(b.ctx, b.pool, r)
		require.NoError(t, err)
	}
	small := func(c *scheduler.Config) { c.BatchSize = 7; c.Emitters = 4 }
	x := b.start(t, small)
	y := b.start(t, small)
	b.waitRetries(t, retrystore.ListFilter{Kind: "ties", State: retrystore.StateDue, Limit: n}, n)
	requireEachOnce(t, b.streamMsgs(t, "retry.ties.due.*"), n)
	// Each row was claimed by one batch.
	waitMetricSum(t, []prometheus.Gatherer{x.reg, y.reg}, float64(n), "retryd_scheduler_due_total", "kind", "ties")
	for i := range n {
		row, err := retrystore.Get(b.ctx, b.pool, "ties", fmt.Sprintf("t%03d", i))
		require.NoError(t, err)
		require.Equal(t, 1, row.DueEmissions, row.ItemID)
	}
}

// A release makes a source's held rows due a microsecond apart, in the
// order they were first held; the gate hands out slots in the order their
// dues reach it. The emitters of a burst claim batches concurrently but
// publish them in turn, so RETRIES stores the dues of one instance in
// next_attempt_at order.
func TestBurstPublishesBatchesInOrder(t *testing.T) {
	t.Parallel()
	b := setup(t)
	released := time.Now().Add(-time.Second)
	const n = 600
	want := make([]string, 0, n)
	for i := range n {
		at := released.Add(time.Duration(i+1) * time.Microsecond)
		r := retrystore.Retry{
			Kind: "event", ItemID: fmt.Sprintf("rel%04d", i), State: retrystore.StateScheduled, Attempt: 2,
			MaxRetries: 3, RetryEnabled: true, PolicyName: "default", PolicyVersion: 1, NextAttemptAt: &at,
		}
		_, err := retrystore.Save(b.ctx, b.pool, r)
		require.NoError(t, err)
		want = append(want, fmt.Sprintf("event-retry:rel%04d:2", i))
	}
	b.start(t, func(c *scheduler.Config) { c.BatchSize = 20; c.Emitters = 4 })
	var got []string
	require.Eventually(t, func() bool {
		got = got[:0]
		for _, m := range b.streamMsgs(t, "retry.event.due.*") {
			got = append(got, m.Headers().Get(contract.HeaderMsgID))
		}
		return len(got) >= n
	}, waitFor, 20*time.Millisecond)
	require.Equal(t, want, got, "dues stored out of release order")
}
