package ingress_test

import (
	"testing"
	"time"

	"github.com/prometheus/client_golang/prometheus"
	"github.com/stretchr/testify/require"

	"github.com/retryd/retryd/pkg/contract"
	"github.com/retryd/retryd/services/ingress"
)

// lateAhead holds two events of source billing behind an admitted one,
// "late" and "next", with room for both in the current window: late's
// slot came a second ago, its due still on its way, and next's slot is
// now.
func (b *bundle) lateAhead(t *testing.T) {
	t.Helper()
	b.throttled(t, "billing", "invoice.paid", "first", "late", "next")
	// The limit is raised in the row, not through the API: a change
	// through the API releases the holders in a line.
	_, err := b.pool.Exec(b.ctx, `UPDATE event_sources SET rate_limit = 5 WHERE source = 'billing'`)
	require.NoError(t, err)
	_, err = b.pool.Exec(b.ctx, `DELETE FROM event_source_windows`)
	require.NoError(t, err)
	for id, ago := range map[string]string{"late": "1 second", "next": "0"} {
		_, err = b.pool.Exec(b.ctx, `UPDATE event_source_holds SET slot_at = now() - $2::interval WHERE event_id = $1`, id, ago)
		require.NoError(t, err)
	}
}

// A throttled event whose due is late (its slot passed a second ago, the
// due still on its way) is admitted by the due of the holder behind it,
// ahead of that one on EVENTS: arrival order holds. Its own due, when it
// comes, finds it admitted and closes its retry with succeeded; twice, the
// second is a duplicate.
func TestLateHolderIsAdmittedAheadOfTheHolderBehind(t *testing.T) {
	t.Parallel()
	b := setup(t)
	b.lateAhead(t)

	b.publishDue(t, "next", "billing", 2)
	b.waitStatus(t, "admitted", "late", "next")
	require.Eventually(t, func() bool { return len(b.admissionOrder(t, "billing")) == 3 }, eventually, 20*time.Millisecond)
	require.Equal(t, []string{"first", "late", "next"}, b.admissionOrder(t, "billing"), "in arrival order on EVENTS")
	require.Len(t, b.lifecycle(t, "next")[contract.Succeeded], 1)
	require.Empty(t, b.lifecycle(t, "late")[contract.Succeeded], "its due closes its retry")
	require.Equal(t, 2, b.count(t, `SELECT admitted FROM event_source_windows WHERE source = 'billing'`))

	for range 2 {
		b.publishDue(t, "late", "billing", 2)
	}
	require.Eventually(t, func() bool { return len(b.lifecycle(t, "late")[contract.Succeeded]) == 1 }, eventually, 20*time.Millisecond)
	b.drained(t, ingress.ConsumerRetry)
	sd := b.lifecycle(t, "late")[contract.Succeeded][0].Succeeded
	require.Equal(t, 2, sd.Attempt)
	require.Len(t, b.lifecycle(t, "late")[contract.Succeeded], 1, "the second due is a duplicate")
	require.Equal(t, 1, b.admittedIDs(t)["late"], "admitted once")
	require.EqualValues(t, 2, b.counter(t, "retryd_ingress_retries_total", map[string]string{"source": "billing", "event": "completed"}))
}

// A crash after the holder behind committed, the late holder admitted
// with it, nothing published and its due not acked: a fresh instance
// publishes both once, in line order, the holder's due comes back as a
// duplicate, and the late holder's own due then closes its retry.
func TestCrashAfterLateHolderAdmittedPublishesEachOnce(t *testing.T) {
	t.Parallel()
	b := setup(t)
	b.lateAhead(t)
	require.NoError(t, b.svc.Stop(b.ctx))
	_, _, kill := b.crashAt(t, ingress.FailpointRetryCommitted)
	require.Eventually(t, func() bool { return b.outboxRows(t) == 0 }, eventually, 20*time.Millisecond)

	b.publishDue(t, "next", "billing", 2)
	b.waitStatus(t, "admitted", "late", "next")
	require.Equal(t, 3, b.outboxRows(t), "late's event, next's event and its succeeded: %v", b.outboxSubjects(t))
	kill()

	b.start(t, testConfig(t, b.pool, b.js, prometheus.NewRegistry()))
	require.Eventually(t, func() bool { return b.outboxRows(t) == 0 }, eventually, 20*time.Millisecond)
	b.drained(t, ingress.ConsumerRetry)
	require.Equal(t, []string{"first", "late", "next"}, b.admissionOrder(t, "billing"))
	require.Len(t, b.lifecycle(t, "next")[contract.Succeeded], 1)

	b.publishDue(t, "late", "billing", 2)
	require.Eventually(t, func() bool { return len(b.lifecycle(t, "late")[contract.Succeeded]) == 1 }, eventually, 20*time.Millisecond)
	require.Equal(t, map[string]int{"first": 1, "late": 1, "next": 1}, b.admittedIDs(t))
}
