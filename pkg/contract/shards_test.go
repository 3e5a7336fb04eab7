package contract_test

import (
	"errors"
	"testing"

	"github.com/stretchr/testify/require"

	"github.com/retryd/retryd/pkg/contract"
)

// The vectors are what nats-server v2.15 stored for
// retry.job.failed.<id> under RetryShardTransform(4) (the streams
// package checks the transform against a live server too).
func TestShardMatchesServerPartition(t *testing.T) {
	t.Parallel()
	for id, want := range map[string]int{"a": 3, "b": 2, "c": 1, "d": 0, "e": 3} {
		require.Equal(t, want, contract.Shard("job", id, 4), id)
	}
	require.Zero(t, contract.Shard("job", "a", 1))
	require.Zero(t, contract.Shard("job", "a", 0))
}

// Splitting n shards into 2n moves an item only from shard s to s+n:
// what resharding relies on.
func TestShardSplitMovesToSPlusN(t *testing.T) {
	t.Parallel()
	for _, n := range []int{1, 2, 4, 8} {
		for i := range 2000 {
			id := "item-" + string(rune('a'+i%26)) + string(rune('a'+i/26%26)) + string(rune('a'+i/676))
			s, s2 := contract.Shard("event", id, n), contract.Shard("event", id, 2*n)
			require.True(t, s2 == s || s2 == s+n, "%s: %d of %d went to %d of %d", id, s, n, s2, 2*n)
		}
	}
}

func TestRetryShardTransformRoundTrip(t *testing.T) {
	t.Parallel()
	src, dest := contract.RetryShardTransform(4)
	require.Equal(t, "retry.*.*.*", src)
	require.Equal(t, "retry.{{wildcard(1)}}.{{wildcard(2)}}.{{wildcard(3)}}.{{partition(4,1,3)}}", dest)
	n, ok := contract.ParseRetryShardTransform(dest)
	require.True(t, ok)
	require.Equal(t, 4, n)
	for _, bad := range []string{"", "retry.>", "retry.{{wildcard(1)}}.{{wildcard(2)}}.{{wildcard(3)}}.{{partition(4,1)}}", "retry.{{wildcard(1)}}.{{wildcard(2)}}.{{wildcard(3)}}.{{partition(0,1,3)}}"} {
		_, ok := contract.ParseRetryShardTransform(bad)
		require.False(t, ok, bad)
	}
}

func TestParseRetrySubjectShardToken(t *testing.T) {
	t.Parallel()
	p, err := contract.ParseRetrySubject("retry.job.failed.j1.3")
	require.NoError(t, err)
	require.Equal(t, contract.RetrySubjectParts{Kind: "job", Event: contract.Failed, ID: "j1", Shard: "3"}, p)
	for _, bad := range []string{"retry.job.failed.j1.03", "retry.job.failed.j1.x", "retry.job.failed.j1.1024", "retry.job.failed.j1.-1", "retry.job.failed.j1.1.2"} {
		_, err := contract.ParseRetrySubject(bad)
		require.Error(t, err, bad)
		require.True(t, errors.Is(err, contract.ErrInvalid), bad)
	}
}

func TestValidateShards(t *testing.T) {
	t.Parallel()
	require.NoError(t, contract.ValidateShards("Shards", 0, "Shard", 0))
	require.NoError(t, contract.ValidateShards("Shards", 4, "Shard", 3))
	require.ErrorContains(t, contract.ValidateShards("Shards", 4, "Shard", 4), "Shard")
	require.ErrorContains(t, contract.ValidateShards("Shards", 2000, "Shard", 0), "Shards")
	require.ErrorContains(t, contract.ValidateShards("Shards", 0, "Shard", 1), "Shard")
}
