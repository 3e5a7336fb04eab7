package main

import (
	"context"
	"testing"
	"time"

	"github.com/nats-io/nats.go/jetstream"
	"github.com/rs/zerolog"
	"github.com/stretchr/testify/require"

	"github.com/retryd/retryd/internal/natstest"
	"github.com/retryd/retryd/pkg/contract"
)

// The example runs against a server, enqueues its samples and reports
// their first attempts.
func TestRunEnqueuesAndReports(t *testing.T) {
	srv := natstest.RunServer(t)
	t.Setenv("NATS_URL", srv.ClientURL())
	ctx, cancel := context.WithCancel(context.Background())
	done := make(chan error, 1)
	go func() { done <- run(ctx, zerolog.New(zerolog.NewTestWriter(t)).Level(zerolog.WarnLevel), 1, 2) }()

	_, js := natstest.Connect(t, srv)
	var outcomes jetstream.Consumer
	require.Eventually(t, func() bool {
		var err error
		outcomes, err = js.OrderedConsumer(context.Background(), contract.StreamRetries, jetstream.OrderedConsumerConfig{
			FilterSubjects: []string{"retry.job.failed.*"},
		})
		return err == nil
	}, 10*time.Second, 20*time.Millisecond, "streams never created")
	classes := map[string]string{}
	for range 3 {
		msg, err := outcomes.Next(jetstream.FetchMaxWait(10 * time.Second))
		require.NoError(t, err)
		ev, err := contract.DecodeLifecycle(msg.Subject(), msg.Data())
		require.NoError(t, err)
		classes[ev.Failed.JobType+"/"+ev.Failed.Error.Class] = string(ev.Failed.Checkpoint)
	}
	require.Equal(t, map[string]string{
		"onboarding/network":   `{"step":"create_account","done":["create_account"]}`,
		"flaky_api/timeout":    "",
		"flaky_api/validation": "",
	}, classes)
	cancel()
	require.NoError(t, <-done)
}
