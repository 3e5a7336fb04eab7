package main

import (
	"encoding/json"
	"fmt"
	"testing"

	"github.com/stretchr/testify/require"

	"github.com/retryd/retryd/cmd/retryd/internal/shards"
	"github.com/retryd/retryd/internal/natstest"
	"github.com/retryd/retryd/migrations/pgtest"
	"github.com/retryd/retryd/pkg/contract"
	"github.com/retryd/retryd/services/scheduler"
)

// The command refuses counts and databases that do not fit, naming the
// flag, and a dry run changes nothing. The split itself is tested in
// internal/shards with running schedulers.
func TestShardsCommand(t *testing.T) {
	t.Parallel()
	srv := natstest.RunServer(t)
	_, js := natstest.Connect(t, srv)
	natstest.EnsureStreams(t, js)
	nats := fmt.Sprintf("nats://127.0.0.1:%d", natstest.Port(srv))
	u0, u1 := pgtest.NewDatabaseURL(t), pgtest.NewDatabaseURL(t)

	for _, tc := range []usageCase{
		{[]string{"shards", "split", "--nats-url", nats, "--database-url", u0, "--database-url", u1}, "--to"},
		{[]string{"shards", "split", "--nats-url", nats, "--to", "3", "--from", "2", "--database-url", u0}, "--to"},
		{[]string{"shards", "split", "--nats-url", nats, "--to", "2", "--database-url", u0}, "--database-url"},
		{[]string{"shards", "split", "--nats-url", nats, "--to", "2", "--database-url", u0, "--database-url", u0}, "same database"},
		{[]string{"shards", "split", "--nats-url", nats, "--to", "2", "--batch", "0", "--database-url", u0, "--database-url", u1}, "--batch"},
		{[]string{"shards", "status", "--nats-url", nats, "--database-url", u0, "--database-url", u1}, "--database-url"},
	} {
		r := cli(t, tc.args...)
		require.Equal(t, exitUsage, r.code, "retryd %v: %s %s", tc.args, r.stdout, r.stderr)
		require.Contains(t, r.stderr, tc.want, "retryd %v", tc.args)
	}

	r := cli(t, "shards", "split", "--nats-url", nats, "--to", "2", "--dry-run", "--database-url", u0, "--database-url", u1)
	require.Equal(t, exitOK, r.code, r.stderr)
	require.Contains(t, r.stdout, "Dry run: 0 item(s) would move from 1 to 2 shards; nothing changed.")

	r = cli(t, "shards", "status", "--json", "--nats-url", nats, "--database-url", u0)
	require.Equal(t, exitOK, r.code, r.stderr)
	var st shards.Status
	require.NoError(t, json.Unmarshal([]byte(r.stdout), &st))
	require.Equal(t, 1, st.Shards, "the dry run left the stream unsplit")
	require.Len(t, st.PerShard, 1)
	require.False(t, st.PerShard[0].Exists)
	require.Equal(t, int64(0), st.PerShard[0].Rows.Total)

	// Without a scheduler to wait for, an empty shard 0 splits at once.
	_, err := js.CreateOrUpdateConsumer(t.Context(), contract.StreamRetries, scheduler.ConsumerConfig(scheduler.Config{}))
	require.NoError(t, err)
	r = cli(t, "shards", "split", "--nats-url", nats, "--to", "2", "--database-url", u0, "--database-url", u1)
	require.Equal(t, exitOK, r.code, r.stderr)
	require.Contains(t, r.stdout, "RETRIES split from 1 to 2 shards at sequence 0.")
	require.Contains(t, r.stdout, "0 item(s) moved. Now start the schedulers of the new shards 1 (RETRYD_SHARDS=2")
	require.Contains(t, r.stderr, "old shard applied the old layout", "progress on stderr")
	r = cli(t, "shards", "split", "--nats-url", nats, "--to", "2", "--database-url", u0, "--database-url", u1)
	require.Equal(t, exitUsage, r.code, "a rerun names the old count")
	require.Contains(t, r.stderr, "--from")
	r = cli(t, "shards", "split", "--nats-url", nats, "--from", "1", "--to", "2", "--database-url", u0, "--database-url", u1)
	require.Equal(t, exitOK, r.code, r.stderr)
	require.Contains(t, r.stdout, "RETRIES was already split into 2 shards")
	r = cli(t, "shards", "status", "--nats-url", nats, "--database-url", u0, "--database-url", u1)
	require.Equal(t, exitOK, r.code, r.stderr)
	require.Contains(t, r.stdout, "RETRIES is split into 2 shard(s)")
	require.Contains(t, r.stdout, "scheduler-shard-1")
}
