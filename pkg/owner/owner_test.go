package owner_test

import (
	"context"
	"encoding/json"
	"errors"
	"sync/atomic"
	"testing"
	"time"

	natsserver "github.com/nats-io/nats-server/v2/test"
	"github.com/nats-io/nats.go"
	"github.com/nats-io/nats.go/jetstream"
	"github.com/prometheus/client_golang/prometheus"
	"github.com/stretchr/testify/require"

	"github.com/retryd/retryd/pkg/contract"
	"github.com/retryd/retryd/pkg/owner"
)

// setup runs an embedded JetStream server with a RETRIES stream as retryd
// creates it for these subjects (retry.>, a duplicate window), and an
// owner of kind "parcel" whose handler is h.
func setup(t *testing.T, h owner.Handler) (jetstream.JetStream, *prometheus.Registry) {
	t.Helper()
	opts := natsserver.DefaultTestOptions
	opts.Port, opts.JetStream, opts.StoreDir = -1, true, t.TempDir()
	srv := natsserver.RunServer(&opts)
	t.Cleanup(srv.Shutdown)
	nc, err := nats.Connect(srv.ClientURL())
	require.NoError(t, err)
	t.Cleanup(nc.Close)
	js, err := jetstream.New(nc)
	require.NoError(t, err)
	ctx := context.Background()
	_, err = js.CreateStream(ctx, jetstream.StreamConfig{Name: contract.StreamRetries, Subjects: []string{"retry.>"}, Duplicates: 2 * time.Minute})
	require.NoError(t, err)
	reg := prometheus.NewRegistry()
	o, err := owner.New(owner.Config{JS: js, Kind: "parcel", Handler: h, Registerer: reg, AckWait: time.Second})
	require.NoError(t, err)
	require.NoError(t, o.Start(ctx))
	t.Cleanup(func() { _ = o.Stop(context.Background()) })
	return js, reg
}

func publishDue(t *testing.T, js jetstream.JetStream, id string, attempt int, msgID string) {
	t.Helper()
	msg, err := contract.NewLifecycleMsg("test", contract.Due, contract.DueData{Kind: "parcel", ID: id, Attempt: attempt,
		NextAttemptAt: time.Now(), Payload: json.RawMessage(`{"n":1}`)}, time.Now())
	require.NoError(t, err)
	msg.Header.Set(contract.HeaderMsgID, msgID)
	_, err = js.PublishMsg(context.Background(), msg)
	require.NoError(t, err)
}

// stored counts the facts on subject.
func stored(t *testing.T, js jetstream.JetStream, subject string) uint64 {
	t.Helper()
	st, err := js.Stream(context.Background(), contract.StreamRetries)
	require.NoError(t, err)
	info, err := st.Info(context.Background(), jetstream.WithSubjectFilter(subject))
	require.NoError(t, err)
	return info.State.Subjects[subject]
}

// A due delivered twice (the scheduler re-emits it, or a crash after the
// fact and before the ack) runs the handler again, and its fact is stored
// once: the fact's Nats-Msg-Id is the attempt's.
func TestDueDeliveredTwiceStoresOneFact(t *testing.T) {
	t.Parallel()
	var runs atomic.Int32
	js, _ := setup(t, func(_ context.Context, it *owner.Item) error {
		runs.Add(1)
		return nil
	})
	publishDue(t, js, "p1", 2, "parcel-retry:p1:2")
	require.Eventually(t, func() bool { return stored(t, js, "retry.parcel.succeeded.p1") == 1 }, 10*time.Second, 20*time.Millisecond)
	publishDue(t, js, "p1", 2, "parcel-retry:p1:2:again") // a second copy the stream does not drop
	require.Eventually(t, func() bool { return runs.Load() == 2 }, 10*time.Second, 20*time.Millisecond)
	require.Never(t, func() bool { return stored(t, js, "retry.parcel.succeeded.p1") != 1 }, 500*time.Millisecond, 50*time.Millisecond)
}

// A due that does not decode is terminated and counted, without running
// the handler; a panicking handler reports a failure of class temporary.
func TestMalformedDueAndPanic(t *testing.T) {
	t.Parallel()
	var runs atomic.Int32
	js, reg := setup(t, func(_ context.Context, it *owner.Item) error {
		runs.Add(1)
		if it.ID == "boom" {
			panic("boom")
		}
		return errors.New("unreachable")
	})
	_, err := js.Publish(context.Background(), "retry.parcel.due.bad", []byte(`{"not":"an envelope"`))
	require.NoError(t, err)
	require.Eventually(t, func() bool {
		return metricSum(t, reg, "retryd_owner_malformed_total") == 1
	}, 10*time.Second, 20*time.Millisecond)
	require.Zero(t, runs.Load())

	publishDue(t, js, "boom", 3, "parcel-retry:boom:3")
	require.Eventually(t, func() bool { return stored(t, js, "retry.parcel.failed.boom") == 1 }, 10*time.Second, 20*time.Millisecond)
	st, err := js.Stream(context.Background(), contract.StreamRetries)
	require.NoError(t, err)
	m, err := st.GetLastMsgForSubject(context.Background(), "retry.parcel.failed.boom")
	require.NoError(t, err)
	ev, err := contract.DecodeLifecycle(m.Subject, m.Data)
	require.NoError(t, err)
	require.Equal(t, "temporary", ev.Failed.Error.Class)
	require.Equal(t, 3, ev.Failed.Attempt)
	require.JSONEq(t, `{"n":1}`, string(ev.Failed.Payload), "the payload goes back with the failure")
}

// metricSum is the sum of a counter's series in reg.
func metricSum(t *testing.T, reg *prometheus.Registry, name string) float64 {
	t.Helper()
	mfs, err := reg.Gather()
	require.NoError(t, err)
	var sum float64
	for _, mf := range mfs {
		if mf.GetName() == name {
			for _, m := range mf.GetMetric() {
				sum += m.GetCounter().GetValue()
			}
		}
	}
	return sum
}
