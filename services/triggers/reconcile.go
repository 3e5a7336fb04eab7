package triggers

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"time"

	"github.com/jackc/pgx/v5"

	"github.com/retryd/retryd/internal/inbox"
	"github.com/retryd/retryd/internal/outbox"
	"github.com/retryd/retryd/internal/wait"
	"github.com/retryd/retryd/pkg/contract"
	"github.com/retryd/retryd/pkg/errclass"
	"github.com/retryd/retryd/services/triggers/internal/triggerstore"
	"github.com/retryd/retryd/stores/pgdb"
)

// reconcileBatch bounds the deliveries one reconcile pass republishes.
const reconcileBatch = 500

// loopContext is the context of a background loop: it ends when the
// service stops (quit) or its run context does.
func (s *Service) loopContext() (context.Context, context.CancelFunc) {
	ctx, cancel := context.WithCancel(s.runCtx)
	go func() {
		select {
		case <-s.quit:
			cancel()
		case <-ctx.Done():
		}
	}()
	return ctx, cancel
}

func (s *Service) reconcileLoop() {
	defer s.loops.Done()
	ctx, cancel := s.loopContext()
	defer cancel()
	tick := s.cfg.ReconcileInterval
	if tick <= 0 {
		tick = time.Minute
	}
	var lastPrune time.Time
	// The first pass runs at start: a restart is when lost held events
	// are most likely to be found.
	for first := true; first || wait.Sleep(ctx, tick) == nil; first = false {
		if s.cfg.ReconcileInterval > 0 {
			if _, err := s.Reconcile(ctx); err != nil && ctx.Err() == nil {
				s.log.Error().Err(err).Msg("reconcile held deliveries")
			}
		}
		if time.Since(lastPrune) >= time.Hour {
			lastPrune = time.Now()
			s.prune(ctx)
		}
	}
}

// prune deletes the events no held delivery needs any more and, unless
// disabled, the inbox rows older than Config.InboxRetention.
func (s *Service) prune(ctx context.Context) {
	if n, err := triggerstore.PruneEvents(ctx, s.cfg.Pool, time.Hour); err != nil && ctx.Err() == nil {
		s.log.Error().Err(err).Msg("prune trigger events")
	} else if n > 0 {
		s.log.Info().Int64("rows", n).Msg("trigger events pruned")
	}
	if s.cfg.InboxRetention <= 0 {
		return
	}
	n, err := inbox.Prune(ctx, s.cfg.Pool, s.cfg.InboxRetention, ConsumerEvents, ConsumerRetry, ConsumerRetryState, ConsumerRuns, ConsumerRunRetries)
	if err != nil && ctx.Err() == nil {
		s.log.Error().Err(err).Msg("prune inbox")
	} else if n > 0 {
		s.log.Info().Int64("rows", n).Msg("inbox pruned")
	}
}

// Reconcile publishes the held event again for held deliveries whose
// last held attempt the scheduler has not confirmed for
// Config.ReconcileAfter, and the failure of runs it has not answered:
// those facts may have been lost with a purged RETRIES stream or a
// restored scheduler database. They keep their Nats-Msg-Id, so a
// scheduler that has them treats the repeat as a duplicate. It returns
// how many it republished.
func (s *Service) Reconcile(ctx context.Context) (int, error) {
	now, err := triggerstore.Now(ctx, s.cfg.Pool)
	if err != nil {
		return 0, err
	}
	list, err := triggerstore.Unconfirmed(ctx, s.cfg.Pool, now.Add(-s.cfg.ReconcileAfter), reconcileBatch)
	if err != nil {
		return 0, err
	}
	n := 0
	for _, d := range list {
		done, err := s.reconcileOne(ctx, d.ID)
		if err != nil {
			return n, fmt.Errorf("reconcile delivery %s: %w", d.ID, err)
		}
		if done {
			n++
			s.metrics.reconciled.Inc()
			s.log.Warn().Str("delivery_id", d.ID).Str("trigger_id", d.TriggerID).Int("attempt", d.RetryAttempts).
				Msg("scheduler never confirmed the retry; held event published again")
		}
	}
	runs, err := s.reconcileRuns(ctx, now)
	n += runs
	if n > 0 {
		s.kick()
	}
	return n, err
}

// reconcileRuns reports again the failures of runs the scheduler has not
// answered for Config.ReconcileAfter, under the same message ids: a
// scheduler that has them treats the repeat as a duplicate.
func (s *Service) reconcileRuns(ctx context.Context, now time.Time) (int, error) {
	list, err := triggerstore.UnconfirmedRunRetries(ctx, s.cfg.Pool, now.Add(-s.cfg.ReconcileAfter), reconcileBatch)
	if err != nil {
		return 0, err
	}
	n := 0
	for _, listed := range list {
		done := false
		err := pgx.BeginFunc(ctx, s.cfg.Pool, func(tx pgx.Tx) error {
			run, ok, err := triggerstore.LockUnconfirmedRun(ctx, tx, listed.ID, listed.Attempt)
			if err != nil || !ok {
				return err
			}
			done = true
			return s.runFailure(ctx, tx, run, contract.ErrorInfo{Class: run.LastErrorClass, Message: run.LastErrorMessage}, now)
		})
		if err != nil {
			return n, fmt.Errorf("reconcile run %s: %w", listed.ID, err)
		}
		if done {
			n++
			s.metrics.reconciled.Inc()
			s.log.Warn().Str("run_id", listed.ID).Str("trigger_id", listed.TriggerID).Int("attempt", listed.Attempt).
				Msg("scheduler never answered the run's failure; failure published again")
		}
	}
	return n, nil
}

func (s *Service) reconcileOne(ctx context.Context, id string) (bool, error) {
	done := false
	err := pgx.BeginFunc(ctx, s.cfg.Pool, func(tx pgx.Tx) error {
		d, err := triggerstore.LockDelivery(ctx, tx, id)
		if err != nil {
			return err
		}
		if !d.Status.Held() || d.RetryState != triggerstore.RetryScheduled || d.ScheduledAttempt > d.RetryAttempts || d.RetryAttempts < 1 {
			return nil // confirmed or resolved since the listing
		}
		now, err := triggerstore.Now(ctx, tx)
		if err != nil {
			return err
		}
		hd := contract.HeldData{
			Kind: contract.KindEventTrigger, ID: d.ID, Attempt: d.RetryAttempts,
			Reason: contract.HoldConcurrency, HoldKey: d.TriggerID, Source: d.Source,
			Detail:   "held back by " + d.StatusReason,
			Metadata: map[string]string{"trigger_id": d.TriggerID, "event_id": d.EventID, "reconciled": "true"},
		}
		if d.Status == triggerstore.StatusThrottled {
			hd.Reason = contract.HoldThrottle
			if d.NextAttemptAt != nil {
				until := d.NextAttemptAt.UTC()
				hd.Until = &until
			}
		}
		// The original payload went with the lost message; triggers kept
		// the event when it held the delivery.
		if stored, err := triggerstore.GetEvent(ctx, tx, d.EventID); err == nil && len(stored) <= maxEmbeddedEnvelopeSize {
			if p, err := json.Marshal(retryPayload{Event: stored}); err == nil {
				hd.Payload = p
			}
		} else if err != nil && !errors.Is(err, pgdb.ErrNotFound) {
			return err
		}
		msg, err := contract.NewLifecycleMsg(EventSource, contract.Held, hd, now)
		if err != nil {
			return err
		}
		if err := outbox.Insert(ctx, tx, OutboxOwner, msg); err != nil {
			return err
		}
		done = true
		return triggerstore.TouchDelivery(ctx, tx, d.ID)
	})
	return done, err
}

// leaseLoop ends the runs whose lease ended, every LeaseInterval, so a
// slot frees within about a second of its lease ending, not at the next
// reconcile pass.
func (s *Service) leaseLoop() {
	defer s.loops.Done()
	ctx, cancel := s.loopContext()
	defer cancel()
	for first := true; first || wait.Sleep(ctx, s.cfg.LeaseInterval) == nil; first = false {
		for {
			n, err := s.ExpireRuns(ctx)
			if err != nil && ctx.Err() == nil {
				s.log.Error().Err(err).Msg("expire runs")
			}
			// A full batch: more may have ended; go on at once.
			if err != nil || n < reconcileBatch {
				break
			}
		}
	}
}

// ExpireRuns fails, as run_timeout (class timeout), the attempts of the
// runs whose lease has ended: no heartbeat and no completed or failed
// message came within their trigger's run timeout (Config.RunTimeout
// unless the trigger sets its own), because a message was lost or the
// executor died. Each goes to retrying and is reported to the scheduler
// in the same transaction, like a failure its executor reported; it keeps
// its slot until it ends. It returns how many runs it failed (at most 500
// a call).
func (s *Service) ExpireRuns(ctx context.Context) (int, error) {
	var runs []triggerstore.Run
	err := pgx.BeginFunc(ctx, s.cfg.Pool, func(tx pgx.Tx) error {
		now, err := triggerstore.Now(ctx, tx)
		if err != nil {
			return err
		}
		if runs, err = triggerstore.ExpireRuns(ctx, tx, now, s.cfg.RunTimeout, reconcileBatch); err != nil {
			return err
		}
		for _, r := range runs {
			if err := s.failedAttempt(ctx, tx, r, timeoutError(), now); err != nil {
				return err
			}
		}
		return nil
	})
	if err != nil {
		return 0, fmt.Errorf("expire runs: %w", err)
	}
	if len(runs) > 0 {
		s.kick()
	}
	for _, r := range runs {
		s.metrics.runsFailed.WithLabelValues(r.TriggerID, string(errclass.Timeout)).Inc()
		ev := s.log.Warn().Str("run_id", r.ID).Str("workflow", r.Workflow).Str("trigger_id", r.TriggerID).
			Str("delivery_id", r.DeliveryID)
		if r.LeaseExpiresAt != nil {
			ev = ev.Time("lease_expires_at", *r.LeaseExpiresAt)
		}
		ev.Msg("run's lease ended without a heartbeat or its end: attempt failed as run_timeout, retry asked of the scheduler")
	}
	return len(runs), nil
}
