package scheduler

import (
	"context"
	"fmt"
	"strconv"

	"github.com/nats-io/nats.go/jetstream"

	"github.com/retryd/retryd/internal/durable"
	"github.com/retryd/retryd/internal/inbox"
	"github.com/retryd/retryd/internal/streams"
	"github.com/retryd/retryd/internal/wait"
	"github.com/retryd/retryd/pkg/contract"
)

// ConsumerName is the durable consumer of the policy stage on RETRIES: of
// an unsplit stream, and of shard 0 of a split one (which so keeps its
// place in the stream across a split). ConsumerNameOf names the others.
const ConsumerName = "scheduler"

// ConsumerNameOf is the durable consumer of shard's policy stage.
func ConsumerNameOf(shard int) string {
	if shard == 0 {
		return ConsumerName
	}
	return ConsumerName + "-shard-" + strconv.Itoa(shard)
}

// policyFacts are the lifecycle events the policy stage decides on.
var policyFacts = []contract.Lifecycle{contract.Failed, contract.Held, contract.Released, contract.Succeeded, contract.Cancelled}

// ConsumerConfig is the configuration of the scheduler's durable consumer.
//
// Shard 0, and an unsplit scheduler, which is shard 0, take the facts as
// an unsplit RETRIES stores them (four tokens) and those stored with
// token 0: a deployment going from one shard to several loses none, and
// an unsplit scheduler still running when the stream is split (or
// restarted with its old count) decides the facts of the items that stay
// on shard 0 from the first one. A consumer updated to new filters keeps
// its position, so a filter added only later would pass over them for
// good. Shard k > 0 takes the facts stored with its token.
// Every shard takes every release (retry.<kind>.released.<hold_key>): a
// hold key is no item, and the held items of one key live on every shard.
func ConsumerConfig(cfg Config) jetstream.ConsumerConfig {
	var filters []string
	for _, ev := range policyFacts {
		switch {
		case ev == contract.Released:
			filters = append(filters, contract.RetryFilter("*", ev))
		case cfg.Shard == 0:
			filters = append(filters, contract.RetryUnsplitFilter("*", ev), contract.RetryShardFilter(ev, 0))
		default:
			filters = append(filters, contract.RetryShardFilter(ev, cfg.Shard))
		}
	}
	desc := "retryd scheduler: failed, held, released, succeeded and cancelled facts of every kind"
	if cfg.Shards > 1 {
		desc += fmt.Sprintf(", shard %d of %d (and every release)", cfg.Shard, cfg.Shards)
	}
	if cfg.Shard == 0 {
		// `nats consumer info` shows the .0 filters on an unsplit stream,
		// where they match nothing yet: say why they are there.
		desc += "; shard 0 takes the four-token subjects of an unsplit RETRIES and those a split one stores with token 0 (.0), " +
			"the latter from the start so that a split loses no fact (docs/shards.md)"
	}
	return jetstream.ConsumerConfig{
		Durable:        ConsumerNameOf(cfg.Shard),
		Description:    desc,
		FilterSubjects: filters,
		DeliverPolicy:  jetstream.DeliverAllPolicy,
		AckPolicy:      jetstream.AckExplicitPolicy,
		AckWait:        cfg.AckWait,
		MaxAckPending:  cfg.MaxAckPending,
		MaxDeliver:     -1,
	}
}

// runReconcileLoop reconciles every ReconcileInterval. (A consumer the
// client reports deleted is recreated within a second by the consumer
// runtime.)
func (s *Scheduler) runReconcileLoop(ctx context.Context) {
	wait.Ticks(ctx, s.cfg.ReconcileInterval, func() {
		if err := s.reconcile(ctx); err != nil && ctx.Err() == nil {
			s.metrics.errors.WithLabelValues("reconcile").Inc()
			s.log.Warn().Err(err).Msg("reconcile")
		}
		if s.cfg.InboxRetention > 0 {
			if n, err := inbox.Prune(ctx, s.cfg.Pool, s.cfg.InboxRetention, Owner); err != nil && ctx.Err() == nil {
				s.log.Warn().Err(err).Msg("prune inbox")
			} else if n > 0 {
				s.log.Debug().Int64("pruned", n).Msg("inbox pruned")
			}
		}
	})
}

// checkShards refuses to start a scheduler whose shard count the stream
// is not split by a multiple of: its filters would take no facts, or
// another shard's. A stream split into more shards than this scheduler
// knows is a resharding in progress (docs/shards.md): this scheduler
// keeps consuming its own token and emitting its rows until it is moved.
func (s *Scheduler) checkShards(ctx context.Context) error {
	stream, err := s.cfg.JS.Stream(ctx, contract.StreamRetries)
	if err != nil {
		return fmt.Errorf("read stream %s: %w", contract.StreamRetries, err)
	}
	cfg := stream.CachedInfo().Config
	have, ok := streams.StreamShards(cfg)
	mine := max(s.cfg.Shards, 1)
	switch {
	case !ok:
		return fmt.Errorf("stream %s has a subject transform retryd did not write (%s): %w", contract.StreamRetries, cfg.SubjectTransform.Destination, ErrShards)
	case have%mine != 0:
		return fmt.Errorf("stream %s is split into %d shards, this scheduler is shard %d of %d: run `retryd streams ensure` with %s=%d first: %w",
			contract.StreamRetries, have, s.cfg.Shard, mine, streams.EnvShards, mine, ErrShards)
	case have > mine:
		s.log.Warn().Int("stream_shards", have).Int("shard", s.cfg.Shard).Int("shards", mine).
			Msg("RETRIES is split into more shards than this scheduler's count: a resharding in progress (docs/shards.md)")
	}
	return nil
}

// reconcile puts back what may have been lost outside Postgres: the
// streams (recreated empty if deleted), the durable consumer and its
// subscription, and the outbox (published now). Pending retries need
// nothing: they live in Postgres and the due loop emits them whatever
// happened to RETRIES.
func (s *Scheduler) reconcile(ctx context.Context) error {
	// Missing streams only: the scheduler's NATS user may create a stream,
	// not change one (streams.CreateMissing).
	if _, err := streams.CreateMissing(ctx, s.cfg.JS, s.cfg.Streams); err != nil {
		return err
	}
	if err := s.ensureConsumer(ctx); err != nil {
		return err
	}
	n, err := s.relay.Flush(ctx)
	if err != nil {
		return fmt.Errorf("flush outbox: %w", err)
	}
	if n > 0 {
		s.log.Info().Int("published", n).Msg("outbox flushed by reconciliation")
	}
	return nil
}

// ensureConsumer recreates the durable consumer when it is missing and
// consumes again when the subscription ended (a deleted consumer or stream
// ends it). Before Start it does nothing: Start creates the consumer.
func (s *Scheduler) ensureConsumer(ctx context.Context) error {
	s.mu.Lock()
	consumers := s.consumers
	s.mu.Unlock()
	if consumers == nil {
		return nil
	}
	if err := consumers.Ensure(ctx); err != nil {
		return fmt.Errorf("ensure consumer %s: %w", ConsumerNameOf(s.cfg.Shard), err)
	}
	return nil
}

// newConsumers builds the runtime of the policy stage's consumer: it
// hands over what is queued, up to ConsumeBatch, without waiting for more
// (a lone message is applied at once and a burst shares transactions),
// and keeps the messages in hand from redelivery with in-progress acks
// every AckWait/4. The ack wait is short so that the messages of a killed
// instance go to another one within seconds; a healthy stage acks within
// milliseconds, so most messages never need an in-progress ack.
func (s *Scheduler) newConsumers() (*durable.Group, error) {
	streamOpts := s.cfg.Streams
	g, err := durable.NewGroup(durable.Config{
		JS: s.cfg.JS, Logger: s.log, Streams: &streamOpts, CheckInterval: s.cfg.ReconcileInterval,
	}, durable.Spec{
		Stream:      contract.StreamRetries,
		Config:      ConsumerConfig(s.cfg),
		HandleBatch: s.handleMessages,
		Batch:       s.cfg.ConsumeBatch,
		Progress:    s.cfg.AckWait / 4,
		InProgress:  s.metrics.inProgress,
	})
	if err != nil {
		return nil, fmt.Errorf("policy stage consumer: %w", err)
	}
	return g, nil
}
