package streams_test

import (
	"fmt"
	"testing"

	"github.com/stretchr/testify/require"

	"github.com/retryd/retryd/internal/streams"
	"github.com/retryd/retryd/pkg/contract"
)

func (b *bundle) storedSubject(t *testing.T, subject string) string {
	t.Helper()
	ack, err := b.js.Publish(b.ctx, subject, []byte(`{}`))
	require.NoError(t, err)
	s, err := b.js.Stream(b.ctx, contract.StreamRetries)
	require.NoError(t, err)
	m, err := s.GetMsg(b.ctx, ack.Sequence)
	require.NoError(t, err)
	return m.Subject
}

// The server places each item on the shard contract.Shard computes, so
// the API can find an item's shard without asking NATS.
func TestSplitStreamStoresTheShardToken(t *testing.T) {
	t.Parallel()
	b := setup(t)
	require.NoError(t, streams.Ensure(b.ctx, b.js, streams.Options{Shards: 4}))
	for i := range 50 {
		id := fmt.Sprintf("01JITEM%03d", i)
		for _, kind := range []string{contract.KindJob, contract.KindEventTrigger} {
			got := b.storedSubject(t, contract.RetrySubject(kind, contract.Failed, id))
			require.Equal(t, fmt.Sprintf("%s.%d", contract.RetrySubject(kind, contract.Failed, id), contract.Shard(kind, id, 4)), got)
			p, err := contract.ParseRetrySubject(got)
			require.NoError(t, err)
			require.Equal(t, id, p.ID)
		}
	}
	n, ok := streams.StreamShards(b.config(t, contract.StreamRetries))
	require.True(t, ok)
	require.Equal(t, 4, n)
}

// Resharding multiplies the count in place; an older service's lower
// count that divides it keeps the split, and a count that would strand
// items is refused naming the variable, changing nothing.
func TestEnsureShardsOnlyMultiplies(t *testing.T) {
	t.Parallel()
	b := setup(t)
	require.NoError(t, streams.Ensure(b.ctx, b.js, streams.Options{}))
	legacy := b.storedSubject(t, contract.RetrySubject("job", contract.Failed, "old"))
	require.Equal(t, "retry.job.failed.old", legacy)

	require.NoError(t, streams.Ensure(b.ctx, b.js, streams.Options{Shards: 2}))
	require.Equal(t, "retry.job.failed.old."+fmt.Sprint(contract.Shard("job", "old", 2)), b.storedSubject(t, contract.RetrySubject("job", contract.Failed, "old")))

	for _, keep := range []int{0, 1, 2} {
		require.NoError(t, streams.Ensure(b.ctx, b.js, streams.Options{Shards: keep}), keep)
		n, _ := streams.StreamShards(b.config(t, contract.StreamRetries))
		require.Equal(t, 2, n, "Shards %d keeps the split", keep)
	}
	err := streams.Ensure(b.ctx, b.js, streams.Options{Shards: 3})
	require.ErrorContains(t, err, "RETRYD_SHARDS=3")
	require.NoError(t, streams.Ensure(b.ctx, b.js, streams.Options{Shards: 4}))
	n, _ := streams.StreamShards(b.config(t, contract.StreamRetries))
	require.Equal(t, 4, n)
	require.ErrorContains(t, streams.Ensure(b.ctx, b.js, streams.Options{Shards: 6}), "only a multiple of 4")

	s, err := b.js.Stream(b.ctx, contract.StreamRetries)
	require.NoError(t, err)
	m, err := s.GetLastMsgForSubject(b.ctx, "retry.job.failed.old")
	require.NoError(t, err, "what was stored before the split keeps its subject")
	require.Equal(t, legacy, m.Subject)
}

func TestOptionsShardsValidate(t *testing.T) {
	t.Parallel()
	require.ErrorContains(t, streams.Options{Shards: -1}.Validate(), "Options.Shards")
	require.ErrorContains(t, streams.Options{Shards: contract.MaxShards + 1}.Validate(), "Options.Shards")
	require.NoError(t, streams.Options{Shards: 8}.Validate())
}
