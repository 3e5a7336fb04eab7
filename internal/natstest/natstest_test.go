package natstest_test

import (
	"context"
	"testing"
	"time"

	"github.com/nats-io/nats.go"
	"github.com/nats-io/nats.go/jetstream"
	"github.com/stretchr/testify/require"

	"github.com/retryd/retryd/internal/natstest"
	"github.com/retryd/retryd/pkg/contract"
)

func TestRunServerEnsureStreamsPublish(t *testing.T) {
	t.Parallel()
	srv := natstest.RunServer(t)
	nc, js := natstest.Connect(t, srv)
	natstest.EnsureStreams(t, js)
	ctx := context.Background()

	msg := nats.NewMsg(contract.JobSubject("email"))
	msg.Data = []byte(`{}`)
	msg.Header.Set(contract.HeaderMsgID, "job:a:1")
	ack, err := js.PublishMsg(ctx, msg)
	require.NoError(t, err)
	require.Equal(t, contract.StreamJobs, ack.Stream)

	// Same Nats-Msg-Id: dropped by the duplicate window.
	ack, err = js.PublishMsg(ctx, msg)
	require.NoError(t, err)
	require.True(t, ack.Duplicate)

	for _, name := range []string{"INGEST", "EVENTS", "RETRIES", "RUNS", "SCHEDULES", "JOBS"} {
		_, err := js.Stream(ctx, name)
		require.NoError(t, err, name)
	}
	require.True(t, nc.IsConnected())
}

// Messages reads what a filter matches, in order, and nothing when it
// matches nothing.
func TestMessages(t *testing.T) {
	t.Parallel()
	_, js := natstest.Connect(t, natstest.RunServer(t))
	natstest.EnsureStreams(t, js)
	ctx := context.Background()
	for i, typ := range []string{"email", "sms", "email"} {
		msg := nats.NewMsg(contract.JobSubject(typ))
		msg.Data = []byte{byte('a' + i)}
		_, err := js.PublishMsg(ctx, msg)
		require.NoError(t, err)
	}
	var got []string
	for _, m := range natstest.Messages(t, ctx, js, contract.StreamJobs, contract.JobSubject("email")) {
		got = append(got, string(m.Data()))
	}
	require.Equal(t, []string{"a", "c"}, got)
	require.Len(t, natstest.Messages(t, ctx, js, contract.StreamJobs, ">"), 3)
	require.Empty(t, natstest.Messages(t, ctx, js, contract.StreamJobs, contract.JobSubject("push")))
}

func TestServersAreIsolated(t *testing.T) {
	t.Parallel()
	a := natstest.RunServer(t)
	b := natstest.RunServer(t)
	require.NotEqual(t, a.ClientURL(), b.ClientURL())
	require.NotEqual(t, a.StoreDir(), b.StoreDir())

	_, jsA := natstest.Connect(t, a)
	natstest.EnsureStreams(t, jsA)
	_, jsB := natstest.Connect(t, b)
	_, err := jsB.Stream(context.Background(), contract.StreamRetries)
	require.ErrorIs(t, err, jetstream.ErrStreamNotFound)
}

func TestRestartKeepsMessagesAndClientsReconnect(t *testing.T) {
	t.Parallel()
	srv := natstest.RunServer(t, natstest.WithSyncAlways())
	nc, js := natstest.Connect(t, srv)
	natstest.EnsureStreams(t, js)
	ctx := context.Background()

	_, err := js.Publish(ctx, contract.JobSubject("email"), []byte(`{"n":1}`))
	require.NoError(t, err)
	port := natstest.Port(srv)

	srv2 := natstest.Restart(t, srv)
	require.False(t, srv.Running())
	require.Equal(t, port, natstest.Port(srv2))

	require.Eventually(t, nc.IsConnected, 10*time.Second, 10*time.Millisecond)
	var info *jetstream.StreamInfo
	require.Eventually(t, func() bool {
		s, err := js.Stream(ctx, contract.StreamJobs)
		if err != nil {
			return false
		}
		info = s.CachedInfo()
		return true
	}, 10*time.Second, 20*time.Millisecond)
	require.Equal(t, uint64(1), info.State.Msgs)

	// The restarted server takes new messages on the same connection.
	_, err = js.Publish(ctx, contract.JobSubject("email"), []byte(`{"n":2}`))
	require.NoError(t, err)
}

func TestWithStoreDirSharesStreamsAcrossServers(t *testing.T) {
	t.Parallel()
	dir := t.TempDir()
	first := natstest.RunServer(t, natstest.WithStoreDir(dir))
	_, js := natstest.Connect(t, first)
	natstest.EnsureStreams(t, js)
	_, err := js.Publish(context.Background(), contract.IngestSubject("shop"), []byte(`{}`))
	require.NoError(t, err)
	first.Shutdown()
	first.WaitForShutdown()

	second := natstest.RunServer(t, natstest.WithStoreDir(dir), natstest.WithSyncInterval(time.Second))
	_, js2 := natstest.Connect(t, second)
	s, err := js2.Stream(context.Background(), contract.StreamIngest)
	require.NoError(t, err)
	require.Equal(t, uint64(1), s.CachedInfo().State.Msgs)
}

// PublishAll stores every message, in order, through a client whose cap
// on outstanding async publishes is far smaller than the batch.
func TestPublishAllUnderASmallCap(t *testing.T) {
	t.Parallel()
	srv := natstest.RunServer(t)
	nc, js := natstest.Connect(t, srv)
	natstest.EnsureStreams(t, js)
	small, err := jetstream.New(nc, jetstream.WithPublishAsyncMaxPending(2))
	require.NoError(t, err)
	ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
	defer cancel()

	msgs := make([]*nats.Msg, 50)
	for i := range msgs {
		msgs[i] = nats.NewMsg(contract.JobSubject("email"))
		msgs[i].Data = []byte{byte(i)}
	}
	acks := natstest.PublishAll(t, ctx, small, msgs)
	require.Len(t, acks, len(msgs))
	for i, ack := range acks {
		require.Equal(t, uint64(i+1), ack.Sequence)
	}
	got := natstest.Messages(t, ctx, js, contract.StreamJobs, ">")
	require.Len(t, got, len(msgs))
	for i, m := range got {
		require.Equal(t, []byte{byte(i)}, m.Data())
	}
}
