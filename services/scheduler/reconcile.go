package scheduler

import (
	"context"
	"fmt"

	"github.com/nats-io/nats.go/jetstream"

	"github.com/retryd/retryd/internal/durable"
	"github.com/retryd/retryd/internal/streams"
	"github.com/retryd/retryd/internal/wait"
	"github.com/retryd/retryd/pkg/contract"
	"github.com/retryd/retryd/projections/inbox"
)

// ConsumerName is the durable consumer of the policy stage on RETRIES.
const ConsumerName = "scheduler"

// ConsumerConfig is the configuration of the scheduler's durable consumer.
func ConsumerConfig(cfg Config) jetstream.ConsumerConfig {
	return jetstream.ConsumerConfig{
		Durable:     ConsumerName,
		Description: "retryd scheduler: failed, held, released, succeeded and cancelled facts of every kind",
		FilterSubjects: []string{
			contract.RetryFilter("*", contract.Failed),
			contract.RetryFilter("*", contract.Held),
			contract.RetryFilter("*", contract.Released),
			contract.RetryFilter("*", contract.Succeeded),
			contract.RetryFilter("*", contract.Cancelled),
		},
		DeliverPolicy: jetstream.DeliverAllPolicy,
		AckPolicy:     jetstream.AckExplicitPolicy,
		AckWait:       cfg.AckWait,
		MaxAckPending: cfg.MaxAckPending,
		MaxDeliver:    -1,
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
		return fmt.Errorf("ensure consumer %s: %w", ConsumerName, err)
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
