package worker_test

import (
	"context"
	"encoding/json"
	"fmt"
	"log"
	"log/slog"
	"os"
	"os/signal"
	"time"

	"github.com/nats-io/nats.go"
	"github.com/nats-io/nats.go/jetstream"

	"github.com/retryd/retryd/pkg/contract"
	"github.com/retryd/retryd/pkg/errclass"
	"github.com/retryd/retryd/pkg/worker"
)

// A multi-step handler records its progress after each step; on a retry
// the checkpoint tells it where to start.
func ExampleJob_SetCheckpoint() {
	job := &worker.Job{ID: "01JA2Q8M9X3T7V5W6Y4Z2B1C0D", Type: "onboarding", Attempt: 1}
	_ = job.SetCheckpoint(map[string]string{"step": "create_account"})

	var cp struct{ Step string }
	ok, _ := job.DecodeCheckpoint(&cp)
	fmt.Println(ok, cp.Step)
	fmt.Println(string(job.Checkpoint))
	// Output:
	// true create_account
	// {"step":"create_account"}
}

// The idempotency key is the same for every delivery of one attempt and
// changes with each retry: key external effects with it.
func ExampleJob_IdempotencyKey() {
	first := &worker.Job{ID: "01JA2Q8M9X3T7V5W6Y4Z2B1C0D", Attempt: 1}
	retry := &worker.Job{ID: "01JA2Q8M9X3T7V5W6Y4Z2B1C0D", Attempt: 2}
	fmt.Println(first.IdempotencyKey())
	fmt.Println(retry.IdempotencyKey())
	// Output:
	// 01JA2Q8M9X3T7V5W6Y4Z2B1C0D:1
	// 01JA2Q8M9X3T7V5W6Y4Z2B1C0D:2
}

// A handler is a plain function: a unit test calls it with a Job and
// checks the class its error reports, with no broker involved.
func ExampleHandler() {
	var send worker.Handler = func(ctx context.Context, job *worker.Job) error {
		var in struct {
			To string `json:"to"`
		}
		if err := job.DecodePayload(&in); err != nil || in.To == "" {
			return errclass.New(errclass.Validation, "payload needs a recipient")
		}
		return nil
	}

	err := send(context.Background(), &worker.Job{ID: "j1", Type: "email", Attempt: 1, Payload: json.RawMessage(`{}`)})
	e, _ := errclass.As(err)
	fmt.Println(e.Class, e.Class.Retryable())
	fmt.Println(send(context.Background(), &worker.Job{ID: "j2", Type: "email", Attempt: 1, Payload: json.RawMessage(`{"to":"ada@example.com"}`)}))
	// Output:
	// validation false
	// <nil>
}

// A handler that must wait for permission holds its job instead of
// failing it: the job comes back after the wait without using a retry.
// WithHoldKey lets a released fact for the tenant lift the hold early.
func ExampleHold() {
	busy := map[string]bool{"t1": true}
	var syncTenant worker.Handler = func(ctx context.Context, job *worker.Job) error {
		var in struct {
			Tenant string `json:"tenant"`
		}
		if err := job.DecodePayload(&in); err != nil {
			return errclass.Wrap(errclass.Validation, err)
		}
		if busy[in.Tenant] {
			return worker.Hold(10*time.Minute, "tenant "+in.Tenant+" is at its sync cap",
				worker.WithHoldKey("tenant-"+in.Tenant), worker.WithHoldReason(contract.HoldConcurrency))
		}
		return nil
	}

	err := syncTenant(context.Background(), &worker.Job{ID: "j1", Type: "sync", Attempt: 1, Payload: json.RawMessage(`{"tenant":"t1"}`)})
	if h, ok := worker.AsHold(err); ok {
		fmt.Println(h.After, h.Reason, h.Key)
		fmt.Println(h.Detail)
	}
	fmt.Println(worker.Hold(-time.Second, "oops"))
	// Output:
	// 10m0s concurrency tenant-t1
	// tenant t1 is at its sync cap
	// hold: after must be more than 0, got -1s
}

// New needs a JetStream context; the logger is any *slog.Logger, here JSON
// lines on stderr. Nil discards the worker's logs.
func ExampleNew() {
	nc, err := nats.Connect(nats.DefaultURL)
	if err != nil {
		log.Fatal(err)
	}
	defer nc.Close()
	js, err := jetstream.New(nc)
	if err != nil {
		log.Fatal(err)
	}
	w, err := worker.New(worker.Config{
		JS:          js,
		Logger:      slog.New(slog.NewJSONHandler(os.Stderr, nil)),
		Concurrency: 8,
	})
	if err != nil {
		log.Fatal(err)
	}
	if err := w.Handle("email", func(ctx context.Context, job *worker.Job) error { return nil }); err != nil {
		log.Fatal(err)
	}
	ctx, stop := signal.NotifyContext(context.Background(), os.Interrupt)
	defer stop()
	if err := w.Start(ctx); err != nil {
		log.Fatal(err)
	}
	<-ctx.Done()
	stopCtx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	_ = w.Stop(stopCtx)
}
