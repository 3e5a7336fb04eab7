// Command workflow is an example workflow engine for retryd: it runs the
// three-node workflow of package engine (fetch, enrich, notify) for the
// runs that triggers request, reports each node and each run's end on
// RUNS, and resumes retried runs after their last completed node. The
// README describes the protocol for an engine in any language.
//
// Run it next to the dev runner, with a trigger whose workflow is
// "orders":
//
//	NATS_URL=nats://127.0.0.1:4222 go run ./examples/workflow -workflow orders
//
// The NATS_* variables of the services (credentials, TLS, inbox prefix)
// apply. SIGTERM or Ctrl-C stops it: no new run is taken, and a run in
// flight is left unacknowledged for the next engine.
package main

import (
	"context"
	"errors"
	"flag"
	"fmt"
	"os"
	"time"

	"github.com/nats-io/nats.go/jetstream"
	"github.com/rs/zerolog"

	"github.com/retryd/retryd/examples/workflow/engine"
	"github.com/retryd/retryd/internal/natsconn"
	"github.com/retryd/retryd/internal/serve"
	"github.com/retryd/retryd/pkg/contract"
)

func main() {
	host, _ := os.Hostname()
	var cfg engine.Config
	flag.StringVar(&cfg.Workflow, "workflow", envOr("WORKFLOW", "orders"), "the workflow to run (WORKFLOW)")
	flag.StringVar(&cfg.Executor, "executor", envOr("EXECUTOR_ID", "workflow-"+host+"-"+fmt.Sprint(os.Getpid())), "this instance's name in steps and ends (EXECUTOR_ID)")
	flag.StringVar(&cfg.Durable, "durable", os.Getenv("WORKFLOW_DURABLE"), "the consumer's name (WORKFLOW_DURABLE; default workflow-<workflow>; the deployed runner user may use \"runner\" only)")
	flag.DurationVar(&cfg.AckWait, "ack-wait", 30*time.Second, "how long a run's message waits for an ack or a heartbeat before redelivery")
	flag.DurationVar(&cfg.Heartbeat, "heartbeat", 0, "how often a run in flight sends a heartbeat (default ack-wait/3)")
	flag.IntVar(&cfg.FailFirst, "fail-first", 2, "executions of enrich that fail per run with class network (negative: none)")
	flag.StringVar(&cfg.SlowNode, "slow-node", "", "test knob: this node waits -slow-for after its effect, before it reports")
	flag.DurationVar(&cfg.SlowFor, "slow-for", time.Minute, "how long -slow-node waits")
	flag.Parse()
	log := zerolog.New(zerolog.ConsoleWriter{Out: os.Stderr, TimeFormat: time.TimeOnly}).With().Timestamp().Logger()
	ctx, stop := serve.SignalContext()
	defer stop()
	if err := run(ctx, log, cfg); err != nil {
		log.Error().Err(err).Msg("workflow engine failed")
		os.Exit(1)
	}
}

func envOr(name, def string) string {
	if v := os.Getenv(name); v != "" {
		return v
	}
	return def
}

func run(ctx context.Context, log zerolog.Logger, cfg engine.Config) error {
	nc, js, err := natsconn.Connect(ctx, natsconn.OptionsFromEnv("retryd-example-workflow"), log)
	if err != nil {
		return err
	}
	defer nc.Close()
	// RUNS belongs to the services; the engine waits for it rather than
	// create it with settings that are not the deployment's.
	if err := waitStream(ctx, js, contract.StreamRuns); err != nil || ctx.Err() != nil {
		return err
	}
	cfg.JS, cfg.Logger = js, log
	eng, err := engine.New(ctx, cfg)
	if err != nil {
		return err
	}
	return eng.Run(ctx)
}

func waitStream(ctx context.Context, js jetstream.JetStream, name string) error {
	for {
		_, err := js.Stream(ctx, name)
		if err == nil {
			return nil
		}
		if !errors.Is(err, jetstream.ErrStreamNotFound) {
			return fmt.Errorf("look up stream %s: %w", name, err)
		}
		select {
		case <-ctx.Done():
			return nil
		case <-time.After(time.Second):
		}
	}
}
