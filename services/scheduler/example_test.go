package scheduler_test

import (
	"context"
	"net/http"
	"os"

	"github.com/jackc/pgx/v5/pgxpool"
	"github.com/nats-io/nats.go"
	"github.com/nats-io/nats.go/jetstream"
	"github.com/prometheus/client_golang/prometheus"
	"github.com/rs/zerolog"

	"github.com/retryd/retryd/internal/serve"
	"github.com/retryd/retryd/services/scheduler"
)

// Running the scheduler inside your own process: the API is mounted next
// to internal/serve's /healthz, /readyz and /metrics.
func Example() {
	ctx := context.Background()
	pool, err := pgxpool.New(ctx, os.Getenv("DATABASE_URL"))
	if err != nil {
		panic(err)
	}
	nc, err := nats.Connect(nats.DefaultURL)
	if err != nil {
		panic(err)
	}
	js, err := jetstream.New(nc)
	if err != nil {
		panic(err)
	}
	reg := prometheus.NewRegistry()
	s, err := scheduler.New(scheduler.Config{
		Pool: pool, JS: js, Registerer: reg,
		Logger: zerolog.New(os.Stderr).With().Timestamp().Logger(),
	})
	if err != nil {
		panic(err)
	}
	if err := s.Start(ctx); err != nil {
		panic(err)
	}
	defer s.Stop(context.Background()) //nolint:errcheck // example

	health := &serve.Health{}
	health.SetReady(true)
	mux := serve.NewMux(reg, health)
	mux.Handle("/v1/", s.Handler())
	// A Guard without a Verifier is authentication off (loopback only);
	// a deployment passes internal/auth's verifier.
	_ = http.ListenAndServe("127.0.0.1:8080", serve.Guard{}.Handler(mux))
}
