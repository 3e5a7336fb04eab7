// Command worker is a small retryd worker built on the worker SDK. It
// handles two job types:
//
//   - onboarding: three steps (create_account, send_welcome,
//     schedule_followup) with a checkpoint after each; a job whose payload
//     says {"fail_at": "send_welcome"} fails there on its first attempt and
//     resumes at that step on the retry.
//   - flaky_api: fails {"failures": N} times with {"class": "timeout" |
//     "rate_limit" | "validation" | "temporary"} before it works.
//
// Run it next to the dev runner (which runs the scheduler and the jobs
// projection):
//
//	NATS_URL=nats://127.0.0.1:4222 go run ./examples/worker -enqueue 3
//
// -enqueue N publishes N sample jobs of each type at start.
package main

import (
	"context"
	"encoding/json"
	"errors"
	"flag"
	"fmt"
	"log/slog"
	"os"
	"time"

	"github.com/nats-io/nats.go/jetstream"
	"github.com/rs/zerolog"
	slogzerolog "github.com/samber/slog-zerolog/v2"

	"github.com/retryd/retryd/internal/natsconn"
	"github.com/retryd/retryd/internal/serve"
	"github.com/retryd/retryd/internal/streams"
	"github.com/retryd/retryd/pkg/contract"
	"github.com/retryd/retryd/pkg/worker"
)

func main() {
	enqueue := flag.Int("enqueue", 0, "publish this many sample jobs of each type at start")
	concurrency := flag.Int("concurrency", 4, "jobs of each type run at once")
	flag.Parse()
	log := zerolog.New(zerolog.ConsoleWriter{Out: os.Stderr, TimeFormat: time.TimeOnly}).With().Timestamp().Logger()
	ctx, stop := serve.SignalContext()
	defer stop()
	if err := run(ctx, log, *enqueue, *concurrency); err != nil {
		log.Error().Err(err).Msg("worker failed")
		os.Exit(1)
	}
}

func run(ctx context.Context, log zerolog.Logger, enqueue, concurrency int) error {
	nc, js, err := natsconn.Connect(ctx, natsconn.OptionsFromEnv("retryd-example-worker"), log)
	if err != nil {
		return err
	}
	defer nc.Close()
	// The services create the streams; creating them when they are missing
	// lets the example start first. Existing streams are left alone: their
	// configuration (replicas, ages) is the deployment's.
	if _, err := js.Stream(ctx, contract.StreamJobs); errors.Is(err, jetstream.ErrStreamNotFound) {
		if err := streams.Ensure(ctx, js, streams.Options{}); err != nil {
			return err
		}
	} else if err != nil {
		return fmt.Errorf("look up stream %s: %w", contract.StreamJobs, err)
	}
	w, err := newWorker(js, log, concurrency)
	if err != nil {
		return err
	}
	if err := w.Start(ctx); err != nil {
		return err
	}
	if err := enqueueSamples(ctx, js, enqueue); err != nil {
		log.Error().Err(err).Msg("enqueue samples failed")
	}
	<-ctx.Done()
	stopCtx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	return w.Stop(stopCtx)
}

func newWorker(js jetstream.JetStream, log zerolog.Logger, concurrency int) (*worker.Worker, error) {
	// The SDK logs through log/slog; a program on slog passes its own
	// *slog.Logger, this one bridges to its zerolog logger.
	slogger := slog.New(slogzerolog.Option{Logger: &log, NoTimestamp: true}.NewZerologHandler())
	w, err := worker.New(worker.Config{JS: js, Logger: slogger, Concurrency: concurrency, Source: "example-worker"})
	if err != nil {
		return nil, err
	}
	fx := newEffects(log)
	if err := w.Handle(TypeOnboarding, fx.onboarding); err != nil {
		return nil, err
	}
	if err := w.Handle(TypeFlaky, fx.flaky); err != nil {
		return nil, err
	}
	return w, nil
}

func enqueueSamples(ctx context.Context, js jetstream.JetStream, n int) error {
	for i := range n {
		jobs := []contract.JobData{
			{JobType: TypeOnboarding, Payload: mustJSON(OnboardingPayload{User: fmt.Sprintf("user-%d", i), FailAt: "send_welcome"})},
			{JobType: TypeFlaky, Payload: mustJSON(FlakyPayload{Failures: 2, Class: "timeout"}), TimeoutMS: 500},
			{JobType: TypeFlaky, Payload: mustJSON(FlakyPayload{Failures: 1, Class: "validation"})},
		}
		for _, job := range jobs {
			if _, err := worker.Enqueue(ctx, js, job); err != nil {
				return err
			}
		}
	}
	return nil
}

func mustJSON(v any) json.RawMessage {
	b, err := json.Marshal(v)
	if err != nil {
		panic(err)
	}
	return b
}
