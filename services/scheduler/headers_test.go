package scheduler_test

import (
	"testing"

	"github.com/nats-io/nats.go"
	"github.com/stretchr/testify/require"

	"github.com/retryd/retryd/pkg/contract"
	"github.com/retryd/retryd/services/scheduler"
	"github.com/retryd/retryd/stores/pgdb"
	"github.com/retryd/retryd/stores/retrystore"
)

// Facts whose headers break the contract (docs/contract.md, headers) are
// terminated and counted, never applied: no Nats-Msg-Id, one that is not
// the envelope's id, or a Retryd-* header that contradicts the subject and
// the body. The same fact with good headers is applied.
func TestFactsWithBadHeadersAreTerminatedAndCounted(t *testing.T) {
	t.Parallel()
	b := setup(t)
	b.policy(t, "hdr", "", 3, 60_000, 60_000)
	s := b.start(t)
	bad := map[string]func(*nats.Msg){
		"no-msg-id":      func(m *nats.Msg) { m.Header.Del(contract.HeaderMsgID) },
		"other-msg-id":   func(m *nats.Msg) { m.Header.Set(contract.HeaderMsgID, "hdr-failed:someone-else:1") },
		"wrong-attempt":  func(m *nats.Msg) { m.Header.Set(contract.HeaderAttempt, "7") },
		"wrong-kind":     func(m *nats.Msg) { m.Header.Set(contract.HeaderKind, "job") },
		"wrong-event":    func(m *nats.Msg) { m.Header.Set(contract.HeaderEvent, "succeeded") },
		"wrong-item":     func(m *nats.Msg) { m.Header.Set(contract.HeaderItemID, "another") },
		"twice-attempt":  func(m *nats.Msg) { m.Header.Add(contract.HeaderAttempt, "1") },
		"no-retryd-hdrs": nil, // optional headers left out: applied
	}
	for id, spoil := range bad {
		m := lifecycleMsg(t, contract.Failed, failed("hdr", id, 1, "timeout"))
		if spoil == nil {
			for _, h := range []string{contract.HeaderKind, contract.HeaderItemID, contract.HeaderAttempt, contract.HeaderEvent} {
				m.Header.Del(h)
			}
		} else {
			spoil(m)
		}
		_, err := b.js.PublishMsg(b.ctx, m)
		require.NoError(t, err)
	}
	b.waitRow(t, "hdr", "no-retryd-hdrs", inState(retrystore.StateScheduled, 2))
	waitMetric(t, s.reg, float64(len(bad)-1), "retryd_scheduler_malformed_total", "consumer", scheduler.Owner)
	b.waitQuiet(t)
	for id, spoil := range bad {
		if spoil == nil {
			continue
		}
		_, err := retrystore.Get(b.ctx, b.pool, "hdr", id)
		require.ErrorIs(t, err, pgdb.ErrNotFound, "%s must not be applied", id)
	}
}
