// Command faultworker is the worker the fault suite runs as a separate
// process: a pkg/worker Worker whose handlers record every execution and
// every effect in Postgres, so the suite can count them after killing it.
//
// Each job's payload says how its attempts behave:
//
//	{"fail_attempts": 2, "class": "temporary", "sleep_ms": 0, "gate": "", "message": "..."}
//
// attempts up to fail_attempts fail with class (default temporary) and
// message as the error text; the
// others succeed after sleeping sleep_ms. A job with a gate also waits,
// after its sleep, until the suite opens that gate (a row in fault_gates):
// a slow job that lasts exactly as long as the scenario needs. A successful attempt records the
// job's effect under the SDK's idempotency key: the effect row is
// inserted with ON CONFLICT DO NOTHING, so an attempt delivered twice has
// its effect once, and fault_job_runs keeps every execution.
//
// Environment: NATS_URL (and the other internal/natsconn variables),
// DATABASE_URL, RETRYD_HTTP_ADDR (/readyz), FAULTWORKER_TYPES (comma
// separated job types), FAULTWORKER_CONCURRENCY (default 4),
// FAULTWORKER_ACK_WAIT (default 30s), FAULTWORKER_ROUTER (default true),
// FAULTWORKER_REPUBLISH_AFTER (worker.Config.RepublishAfter: a scenario
// that shrinks RETRIES' duplicate window sees a purged failure published
// again in seconds, not after the 3-minute default) and
// FAULTWORKER_PENDING_LIMIT (worker.Config.PendingLimit; -1 keeps no
// copies, the SDK as it was before it kept its failures).
package main

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"log/slog"
	"os"
	"strconv"
	"strings"
	"time"

	"github.com/jackc/pgx/v5/pgxpool"
	"github.com/prometheus/client_golang/prometheus"
	"github.com/rs/zerolog"
	slogzerolog "github.com/samber/slog-zerolog/v2"

	"github.com/retryd/retryd/internal/natsconn"
	"github.com/retryd/retryd/internal/serve"
	"github.com/retryd/retryd/pkg/errclass"
	"github.com/retryd/retryd/pkg/worker"
)

// Schema is the effect record; the suite reads it.
const Schema = `
CREATE TABLE IF NOT EXISTS fault_job_runs (
    id        bigint GENERATED ALWAYS AS IDENTITY PRIMARY KEY,
    job_id    text        NOT NULL,
    job_type  text        NOT NULL,
    attempt   integer     NOT NULL,
    outcome   text        NOT NULL,
    pid       integer     NOT NULL,
    at        timestamptz NOT NULL DEFAULT clock_timestamp()
);
CREATE TABLE IF NOT EXISTS fault_gates (
    name      text        PRIMARY KEY,
    opened_at timestamptz NOT NULL DEFAULT clock_timestamp()
);
CREATE TABLE IF NOT EXISTS fault_job_effects (
    idempotency_key text        PRIMARY KEY,
    job_id          text        NOT NULL,
    attempt         integer     NOT NULL,
    at              timestamptz NOT NULL DEFAULT clock_timestamp()
);`

type behaviour struct {
	FailAttempts int    `json:"fail_attempts"`
	Class        string `json:"class"`
	SleepMS      int    `json:"sleep_ms"`
	Gate         string `json:"gate"`
	// Message is the failure's error text (default a fixed one).
	Message string `json:"message"`
}

func main() {
	log := zerolog.New(os.Stderr).With().Timestamp().Str("service", "faultworker").Logger()
	if err := run(log); err != nil {
		log.Error().Err(err).Msg("faultworker failed")
		os.Exit(1)
	}
}

func run(log zerolog.Logger) error {
	ctx, stop := serve.SignalContext()
	defer stop()
	pool, err := pgxpool.New(ctx, os.Getenv("DATABASE_URL"))
	if err != nil {
		return fmt.Errorf("open database: %w", err)
	}
	defer pool.Close()
	if _, err := pool.Exec(ctx, Schema); err != nil {
		return fmt.Errorf("create effect tables: %w", err)
	}
	nc, js, err := natsconn.Connect(ctx, natsconn.OptionsFromEnv("faultworker"), log)
	if err != nil {
		return err
	}
	defer nc.Close()

	concurrency, _ := strconv.Atoi(os.Getenv("FAULTWORKER_CONCURRENCY"))
	ackWait, _ := time.ParseDuration(os.Getenv("FAULTWORKER_ACK_WAIT"))
	republishAfter, _ := time.ParseDuration(os.Getenv("FAULTWORKER_REPUBLISH_AFTER"))
	pendingLimit, _ := strconv.Atoi(os.Getenv("FAULTWORKER_PENDING_LIMIT"))
	reg := prometheus.NewRegistry()
	w, err := worker.New(worker.Config{
		JS: js, Logger: slogger(log), Source: "faults/worker", Concurrency: concurrency, AckWait: ackWait,
		FetchWait: 500 * time.Millisecond, Registerer: reg,
		DisableDueRouter: os.Getenv("FAULTWORKER_ROUTER") == "false",
		RepublishAfter:   republishAfter, PendingLimit: pendingLimit,
	})
	if err != nil {
		return err
	}
	pid := os.Getpid()
	for _, typ := range strings.Split(os.Getenv("FAULTWORKER_TYPES"), ",") {
		if typ == "" {
			continue
		}
		if err := w.Handle(typ, handler(pool, pid)); err != nil {
			return err
		}
	}
	if err := w.Start(ctx); err != nil {
		return err
	}
	health := &serve.Health{}
	health.SetReady(true)
	srv := serve.NewServer(os.Getenv("RETRYD_HTTP_ADDR"), serve.NewMux(reg, health))
	httpDone := make(chan error, 1)
	go func() { httpDone <- serve.Run(ctx, srv, log) }()
	<-ctx.Done()
	health.SetReady(false)
	stopCtx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	return errors.Join(w.Stop(stopCtx), <-httpDone)
}

// slogger hands log to the worker SDK, which logs through log/slog: the
// worker's lines keep log's fields and timestamps, on stderr like the rest.
func slogger(log zerolog.Logger) *slog.Logger {
	return slog.New(slogzerolog.Option{Logger: &log, NoTimestamp: true}.NewZerologHandler())
}

func handler(pool *pgxpool.Pool, pid int) worker.Handler {
	return func(ctx context.Context, job *worker.Job) error {
		var b behaviour
		if len(job.Payload) > 0 {
			if err := json.Unmarshal(job.Payload, &b); err != nil {
				return errclass.NonRetryable(errclass.Wrap(errclass.Validation, err))
			}
		}
		outcome := "succeeded"
		if job.Attempt <= b.FailAttempts {
			outcome = "failed"
		}
		if _, err := pool.Exec(ctx, `INSERT INTO fault_job_runs (job_id, job_type, attempt, outcome, pid) VALUES ($1, $2, $3, $4, $5)`,
			job.ID, job.Type, job.Attempt, outcome, pid); err != nil {
			return errclass.Wrap(errclass.Temporary, err)
		}
		if b.SleepMS > 0 {
			select {
			case <-ctx.Done():
				return ctx.Err()
			case <-time.After(time.Duration(b.SleepMS) * time.Millisecond):
			}
		}
		if b.Gate != "" {
			if err := waitGate(ctx, pool, b.Gate); err != nil {
				return err
			}
		}
		if outcome == "failed" {
			class := errclass.Class(b.Class)
			if class == "" {
				class = errclass.Temporary
			}
			msg := b.Message
			if msg == "" {
				msg = "fault suite: attempt " + strconv.Itoa(job.Attempt) + " fails on purpose"
			}
			return errclass.New(class, msg)
		}
		if _, err := pool.Exec(ctx, `INSERT INTO fault_job_effects (idempotency_key, job_id, attempt) VALUES ($1, $2, $3)
ON CONFLICT (idempotency_key) DO NOTHING`, job.IdempotencyKey(), job.ID, job.Attempt); err != nil {
			return errclass.Wrap(errclass.Temporary, err)
		}
		return nil
	}
}

// gatePoll is how often a gated job looks at its gate.
const gatePoll = 100 * time.Millisecond

// waitGate blocks until the gate's row exists or ctx ends (the job's
// timeout, or a stop).
func waitGate(ctx context.Context, pool *pgxpool.Pool, gate string) error {
	for {
		var open bool
		if err := pool.QueryRow(ctx, `SELECT EXISTS (SELECT 1 FROM fault_gates WHERE name = $1)`, gate).Scan(&open); err != nil {
			return errclass.Wrap(errclass.Temporary, err)
		}
		if open {
			return nil
		}
		select {
		case <-ctx.Done():
			return ctx.Err()
		case <-time.After(gatePoll):
		}
	}
}
