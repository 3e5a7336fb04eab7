// Package engine is the example workflow engine: it takes run requests
// for one workflow from RUNS, runs its three nodes (fetch, enrich,
// notify), reports each node and the run's end on RUNS, and keeps each
// node's effect idempotent across redeliveries and restarts. See the
// README next to it for the protocol it follows.
package engine

import (
	"context"
	"errors"
	"fmt"
	"sync/atomic"
	"time"

	"github.com/nats-io/nats.go/jetstream"
	"github.com/rs/zerolog"

	"github.com/retryd/retryd/pkg/contract"
)

// Config configures an Engine. Zero fields take the defaults named on
// them.
type Config struct {
	// JS is the JetStream context (required). RUNS must exist; the engine
	// creates its own stream and bucket (EffectsStream, StateBucket).
	JS jetstream.JetStream
	// Logger receives the engine's logs.
	Logger zerolog.Logger
	// Workflow is the workflow the engine runs (required): it consumes
	// runs.<Workflow>.requested.* only.
	Workflow string
	// Executor names this engine instance in steps and ends (required).
	Executor string
	// Durable is the consumer's name (default "workflow-<Workflow>"):
	// engines sharing it share the work.
	Durable string
	// AckWait is how long a run may go without an ack or a progress
	// report before RUNS redelivers it (default 30s). The engine reports
	// progress with every heartbeat, so a slow node keeps its message and
	// a dead engine loses it within AckWait.
	AckWait time.Duration
	// Heartbeat is how often a run in flight renews its lease and its
	// message (default AckWait/3).
	Heartbeat time.Duration
	// FetchWait bounds one pull (default 1s); a stop waits at most this
	// long for the pull in progress.
	FetchWait time.Duration
	// FailFirst is how many executions of enrich fail, per run, with class
	// network (default 2; negative: none).
	FailFirst int
	// SlowNode, when set, makes that node wait SlowFor after its effect
	// and before it reports, so a test can kill the engine mid-node, at
	// the point where a crash would duplicate an effect that is not
	// idempotent.
	SlowNode string
	SlowFor  time.Duration
}

func (c *Config) validate() error {
	var errs []error
	if c.JS == nil {
		errs = append(errs, errors.New("Config.JS is required"))
	}
	if err := contract.ValidateToken("Config.Workflow", c.Workflow); err != nil {
		errs = append(errs, err)
	}
	if c.Executor == "" {
		errs = append(errs, errors.New("Config.Executor is required"))
	} else if err := contract.ValidateExecutor("Config.Executor", c.Executor); err != nil {
		errs = append(errs, err)
	}
	if c.Durable == "" {
		c.Durable = "workflow-" + c.Workflow
	}
	if c.AckWait == 0 {
		c.AckWait = 30 * time.Second
	}
	if c.AckWait < time.Second {
		errs = append(errs, fmt.Errorf("Config.AckWait must be at least 1s, got %s", c.AckWait))
	}
	if c.Heartbeat == 0 {
		c.Heartbeat = c.AckWait / 3
	}
	if c.Heartbeat <= 0 || c.Heartbeat >= c.AckWait {
		errs = append(errs, fmt.Errorf("Config.Heartbeat must be between 0 and AckWait (%s), got %s", c.AckWait, c.Heartbeat))
	}
	if c.FetchWait == 0 {
		c.FetchWait = time.Second
	}
	if c.FailFirst == 0 {
		c.FailFirst = 2
	}
	if c.SlowNode != "" && !isNode(c.SlowNode) {
		errs = append(errs, fmt.Errorf("Config.SlowNode %q is not a node of the workflow (%v)", c.SlowNode, NodeNames()))
	}
	return errors.Join(errs...)
}

// Stats counts what the engine did since it started.
type Stats struct {
	Completed, Failed, Malformed, Replayed int64
}

// Engine runs one workflow's runs, one at a time.
type Engine struct {
	cfg     Config
	log     zerolog.Logger
	cons    jetstream.Consumer
	state   jetstream.KeyValue
	effects jetstream.Stream

	completed, failed, malformed, replayed atomic.Int64
}

// New checks cfg and prepares the engine's consumer, stream and bucket.
func New(ctx context.Context, cfg Config) (*Engine, error) {
	if err := cfg.validate(); err != nil {
		return nil, fmt.Errorf("new engine: %w", err)
	}
	e := &Engine{cfg: cfg, log: cfg.Logger.With().Str("workflow", cfg.Workflow).Str("executor", cfg.Executor).Logger()}
	var err error
	if e.effects, e.state, err = ensureStorage(ctx, cfg.JS); err != nil {
		return nil, err
	}
	if e.cons, err = e.consumer(ctx); err != nil {
		return nil, err
	}
	return e, nil
}

// consumer creates or updates the durable pull consumer on the
// workflow's requests. It delivers everything RUNS holds, so requests
// published before the first engine started are run too; the state
// bucket makes a request whose attempt already ended a no-op.
func (e *Engine) consumer(ctx context.Context) (jetstream.Consumer, error) {
	c, err := e.cfg.JS.CreateOrUpdateConsumer(ctx, contract.StreamRuns, jetstream.ConsumerConfig{
		Durable:        e.cfg.Durable,
		FilterSubjects: []string{contract.RunSubject(e.cfg.Workflow, contract.RunRequested, "*")},
		AckPolicy:      jetstream.AckExplicitPolicy,
		AckWait:        e.cfg.AckWait,
		DeliverPolicy:  jetstream.DeliverAllPolicy,
	})
	if err != nil {
		return nil, fmt.Errorf("create consumer %s: %w", e.cfg.Durable, err)
	}
	return c, nil
}

// Stats returns the engine's counters.
func (e *Engine) Stats() Stats {
	return Stats{Completed: e.completed.Load(), Failed: e.failed.Load(), Malformed: e.malformed.Load(), Replayed: e.replayed.Load()}
}

// Run pulls and runs requests until ctx ends. A run in flight when ctx
// ends is abandoned unacknowledged: RUNS redelivers it after AckWait, and
// the state bucket lets the next engine skip the nodes this one finished.
func (e *Engine) Run(ctx context.Context) error {
	e.log.Info().Str("durable", e.cfg.Durable).Msg("workflow engine started")
	for ctx.Err() == nil {
		batch, err := e.cons.Fetch(1, jetstream.FetchMaxWait(e.cfg.FetchWait))
		if err != nil {
			e.pullFailed(ctx, err)
			continue
		}
		for msg := range batch.Messages() {
			e.handle(ctx, msg)
		}
		if err := batch.Error(); err != nil && !errors.Is(err, jetstream.ErrNoMessages) && ctx.Err() == nil {
			e.pullFailed(ctx, err)
		}
	}
	e.log.Info().Msg("workflow engine stopped")
	return nil
}

// pullFailed waits a moment after a failed pull and recreates the
// consumer when it was deleted, so an operator's mistake or a recreated
// stream does not stop the engine for good.
func (e *Engine) pullFailed(ctx context.Context, err error) {
	if ctx.Err() != nil {
		return
	}
	e.log.Warn().Err(err).Msg("pull failed")
	if errors.Is(err, jetstream.ErrConsumerDeleted) || errors.Is(err, jetstream.ErrConsumerNotFound) {
		if c, cerr := e.consumer(ctx); cerr == nil {
			e.cons = c
		}
	}
	select {
	case <-ctx.Done():
	case <-time.After(e.cfg.FetchWait):
	}
}
