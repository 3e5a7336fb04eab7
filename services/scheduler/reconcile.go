package scheduler

import (
	"context"
	"errors"
	"fmt"
	"time"

	"github.com/nats-io/nats.go/jetstream"

	"github.com/retryd/retryd/internal/streams"
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

// runReconcileLoop reconciles every ReconcileInterval, and early when the
// consumer reports it was deleted.
func (s *Scheduler) runReconcileLoop(ctx context.Context) {
	t := time.NewTicker(s.cfg.ReconcileInterval)
	defer t.Stop()
	for {
		select {
		case <-ctx.Done():
			return
		case <-t.C:
		case <-s.reconcileNow:
		}
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
	}
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

// ensureConsumer creates the durable consumer when it is missing and
// (re)starts consuming when the subscription ended (a deleted consumer
// or stream ends it).
func (s *Scheduler) ensureConsumer(ctx context.Context) error {
	s.mu.Lock()
	defer s.mu.Unlock()
	if s.stopped {
		return nil
	}
	_, err := s.cfg.JS.Consumer(ctx, contract.StreamRetries, ConsumerName)
	missing := errors.Is(err, jetstream.ErrConsumerNotFound) || errors.Is(err, jetstream.ErrStreamNotFound)
	if err != nil && !missing {
		return fmt.Errorf("look up consumer %s: %w", ConsumerName, err)
	}
	running := s.consumer != nil
	if running {
		select {
		case <-s.consumer.Closed():
			running = false
		default:
		}
	}
	if !missing && running {
		return nil
	}
	cons, err := s.cfg.JS.CreateOrUpdateConsumer(ctx, contract.StreamRetries, ConsumerConfig(s.cfg))
	if err != nil {
		return fmt.Errorf("create consumer %s: %w", ConsumerName, err)
	}
	if s.consumer != nil {
		s.consumer.Stop()
	}
	cc, err := cons.Consume(s.onMessage,
		jetstream.PullMaxMessages(min(s.cfg.ConsumeBatch, s.cfg.MaxAckPending)),
		jetstream.ConsumeErrHandler(s.onConsumeError))
	if err != nil {
		s.consumer = nil
		return fmt.Errorf("consume %s: %w", ConsumerName, err)
	}
	first := !s.consumed
	s.consumer, s.consumed = cc, true
	switch {
	case missing && first:
		// A new deployment: nothing was lost.
		s.log.Info().Str("consumer", ConsumerName).Msg("consumer created")
	case missing:
		s.log.Warn().Str("consumer", ConsumerName).Msg("consumer was missing and has been created")
	}
	return nil
}

// stopConsumer stops consuming without draining (used when Start fails).
func (s *Scheduler) stopConsumer() {
	s.mu.Lock()
	defer s.mu.Unlock()
	if s.consumer != nil {
		s.consumer.Stop()
		s.consumer = nil
	}
}

func (s *Scheduler) onConsumeError(_ jetstream.ConsumeContext, err error) {
	switch {
	case errors.Is(err, jetstream.ErrConsumerDeleted), errors.Is(err, jetstream.ErrConsumerNotFound),
		errors.Is(err, jetstream.ErrStreamNotFound), errors.Is(err, jetstream.ErrNoHeartbeat):
		s.log.Warn().Err(err).Msg("consumer interrupted; reconciling")
		s.requestReconcile()
	default:
		s.log.Debug().Err(err).Msg("consume")
	}
}
