package main

import (
	"testing"

	"github.com/stretchr/testify/require"

	"github.com/retryd/retryd/services/scheduler"
)

// The jobs API runs where it can act on every job: the home shard, with
// the other shards' databases when RETRIES is split.
func TestCheckShardJobs(t *testing.T) {
	t.Parallel()
	at := func(shard, shards int, jobs bool, urls ...string) settings {
		return settings{jobs: jobs, shardDBURLs: urls, cfg: scheduler.Config{Shard: shard, Shards: shards}}
	}
	require.NoError(t, checkShardJobs(at(0, 0, true)))
	require.NoError(t, checkShardJobs(at(0, 1, true)))
	require.NoError(t, checkShardJobs(at(0, 3, true, "postgres://a/s1", "postgres://b/s2")))
	require.NoError(t, checkShardJobs(at(0, 3, false)))
	require.NoError(t, checkShardJobs(at(2, 3, false)))
	require.ErrorContains(t, checkShardJobs(at(1, 2, true)), "RETRYD_JOBS=true on shard 1")
	require.ErrorContains(t, checkShardJobs(at(0, 3, true, "postgres://a/s1")), "RETRYD_SHARD_DATABASE_URLS names 1 databases for RETRYD_SHARDS=3")
	require.ErrorContains(t, checkShardJobs(at(0, 1, true, "postgres://a/s1")), "only for the home shard's jobs API")
	require.ErrorContains(t, checkShardJobs(at(1, 2, false, "postgres://a/s1")), "only for the home shard's jobs API")
}
