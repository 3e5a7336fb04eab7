package main

import (
	"testing"

	"github.com/stretchr/testify/require"
)

func TestParseCPUTimesCountsIdleAndIOWaitAsNotBusy(t *testing.T) {
	t.Parallel()
	stat := []byte("cpu  100 5 50 800 40 3 2 0 0 0\ncpu0 50 2 25 400 20 1 1 0 0 0\ncpu1 50 3 25 400 20 2 1 0 0 0\nintr 1 2 3\n")
	c, err := parseCPUTimes(stat)
	require.NoError(t, err)
	require.Equal(t, cpuTimes{busy: 160, total: 1000, cpus: 2}, c)
	later := cpuTimes{busy: 160 + 150, total: 1000 + 200, cpus: 2}
	require.InDelta(t, 1.5, coresBusy(c, later), 1e-9)
	_, err = parseCPUTimes([]byte("intr 1\n"))
	require.Error(t, err)
}

func TestShardPendingTakesTheLargestUpTo100k(t *testing.T) {
	t.Parallel()
	require.Equal(t, 100_000, shardPending([]int{10_000, 100_000, 1_000_000}))
	require.Equal(t, 10_000, shardPending([]int{10_000}))
	require.Equal(t, 200_000, shardPending([]int{1_000_000, 200_000}))
}

func TestShardLayoutNames(t *testing.T) {
	t.Parallel()
	require.Equal(t, "1 shard", shardLayout{shards: 1, instances: 1}.String())
	require.Equal(t, "4 shards", shardLayout{shards: 4, instances: 1}.String())
	require.Equal(t, "1 shard, 2 instances", shardLayout{shards: 1, instances: 2}.String())
}
