package outbox_test

import (
	"context"
	"os"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgxpool"
	"github.com/nats-io/nats.go"
	"github.com/nats-io/nats.go/jetstream"
	"github.com/prometheus/client_golang/prometheus"
	"github.com/rs/zerolog"

	"github.com/retryd/retryd/internal/outbox"
	"github.com/retryd/retryd/pkg/contract"
)

// A service writes its state change and the message announcing it in one
// transaction; the relay publishes the message after the commit.
func Example() {
	ctx := context.Background()
	pool, _ := pgxpool.New(ctx, os.Getenv("DATABASE_URL"))
	nc, _ := nats.Connect(nats.DefaultURL)
	js, _ := jetstream.New(nc)

	relay, err := outbox.NewRelay(outbox.RelayConfig{
		Pool:       pool,
		JS:         js,
		Owner:      "my-service",
		Logger:     zerolog.New(os.Stderr),
		Registerer: prometheus.NewRegistry(),
	})
	if err != nil {
		panic(err)
	}
	_ = relay.Start(ctx)
	defer relay.Stop(ctx)

	msg := nats.NewMsg("retry.job.failed.job-42")
	msg.Header.Set(contract.HeaderMsgID, "job-failed:job-42:1")
	msg.Data = []byte(`{"specversion":"1.0"}`)
	err = pgx.BeginFunc(ctx, pool, func(tx pgx.Tx) error {
		// ... the state change ...
		return outbox.Insert(ctx, tx, "my-service", msg)
	})
	if err == nil {
		relay.Kick()
	}
}
