package triggers

import (
	"context"
	"errors"
	"fmt"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/nats-io/nats.go/jetstream"

	"github.com/retryd/retryd/internal/inbox"
	"github.com/retryd/retryd/internal/lifecyclemsg"
	"github.com/retryd/retryd/internal/outbox"
	"github.com/retryd/retryd/pkg/contract"
	"github.com/retryd/retryd/services/triggers/internal/triggerstore"
	"github.com/retryd/retryd/stores/pgdb"
)

// handleRun routes a message of the triggers-runs consumer by its
// subject's event: a run's end or a heartbeat.
func (s *Service) handleRun(ctx context.Context, msg jetstream.Msg) error {
	p, err := contract.ParseRunSubject(msg.Subject())
	if err != nil {
		return err
	}
	switch p.Event {
	case contract.RunHeartbeat:
		return s.handleHeartbeat(ctx, msg)
	case contract.RunStep:
		return s.handleRunStep(ctx, msg)
	}
	return s.handleRunFinished(ctx, msg)
}

// handleHeartbeat renews the lease of a run in flight
// (runs.<workflow>.heartbeat.<run_id>) to now plus its trigger's run
// timeout, on the database clock. Heartbeats are not claimed in the
// inbox: one row per heartbeat would grow the inbox with the heartbeat
// rate, and applying one twice is harmless, because the lease is
// computed from the time the stream stored the heartbeat (capped at the
// database's now) and never moves backwards, so a redelivery or a replay
// of an old heartbeat cannot keep a dead run's slot. A heartbeat for a
// finished or unknown run changes nothing.
func (s *Service) handleHeartbeat(ctx context.Context, msg jetstream.Msg) error {
	_, data, err := contract.DecodeRunHeartbeat(msg.Subject(), msg.Data())
	if err != nil {
		return err
	}
	sentAt := time.Now()
	if md, err := msg.Metadata(); err == nil && !md.Timestamp.IsZero() {
		sentAt = md.Timestamp
	}
	run, extended, err := triggerstore.ExtendLease(ctx, s.cfg.Pool, data.RunID, sentAt, s.cfg.RunTimeout)
	switch {
	case errors.Is(err, pgdb.ErrNotFound):
		s.metrics.heartbeats.WithLabelValues(heartbeatIgnored).Inc()
		s.log.Debug().Str("run_id", data.RunID).Str("workflow", data.Workflow).Msg("heartbeat for a run not launched by a trigger; ignored")
		return nil
	case err != nil:
		return err
	case !extended:
		s.metrics.heartbeats.WithLabelValues(heartbeatIgnored).Inc()
		s.log.Debug().Str("run_id", run.ID).Str("trigger_id", run.TriggerID).Str("status", string(run.Status)).
			Msg("heartbeat for a finished run; ignored")
		return nil
	}
	s.metrics.heartbeats.WithLabelValues(heartbeatExtended).Inc()
	ev := s.log.Debug().Str("run_id", run.ID).Str("workflow", run.Workflow).Str("trigger_id", run.TriggerID)
	if run.LeaseExpiresAt != nil {
		ev = ev.Time("lease_expires_at", *run.LeaseExpiresAt)
	}
	ev.Msg("run lease extended")
	return nil
}

// Results of a heartbeat, the label of retryd_triggers_heartbeats_total.
const (
	heartbeatExtended = "extended"
	heartbeatIgnored  = "ignored"
)

// handleRunFinished applies a run's end (runs.<workflow>.completed|failed.<run_id>).
// A completion ends the run, frees its trigger's concurrency slot and, in
// the same transaction, puts retry.event-trigger.released.<trigger_id> in
// the outbox: the scheduler makes the delivery that has waited longest
// for a slot due at once. A failure of the attempt in flight moves the
// run to retrying and reports it to the scheduler (retry.run.failed),
// which decides whether and when it runs again; the run keeps its slot
// until it ends (runretry.go).
func (s *Service) handleRunFinished(ctx context.Context, msg jetstream.Msg) error {
	env, data, err := contract.DecodeRunFinished(msg.Subject(), msg.Data())
	if err != nil {
		return err
	}
	p, err := contract.ParseRunSubject(msg.Subject())
	if err != nil {
		return err
	}
	failed := p.Event == contract.RunFailed
	var (
		run       triggerstore.Run
		changed   bool
		duplicate bool
		unknown   bool
	)
	err = pgx.BeginFunc(ctx, s.cfg.Pool, func(tx pgx.Tx) error {
		changed, duplicate, unknown = false, false, false
		claimed, err := inbox.Claim(ctx, tx, ConsumerRuns, lifecyclemsg.InboxID(msg, env))
		if err != nil {
			return err
		}
		if !claimed {
			duplicate = true
			return nil
		}
		if failed {
			e := contract.ErrorInfo{Message: "run failed"}
			if data.Error != nil {
				e = *data.Error
			}
			run, changed, err = triggerstore.FailRun(ctx, tx, data.RunID, triggerstore.RunFailure{
				Attempt: max(data.Attempt, 1), Class: e.Class, Message: e.Message, Node: data.Node, Executor: data.Executor,
			})
			if err != nil || !changed {
				return unknownRun(err, &unknown)
			}
			return s.failedAttempt(ctx, tx, run, e, *run.LastErrorTimestamp)
		}
		run, changed, err = triggerstore.CompleteRun(ctx, tx, data.RunID, data.Executor)
		if err != nil || !changed {
			return unknownRun(err, &unknown)
		}
		if run.Retried() {
			if err := s.runSucceeded(ctx, tx, run, *run.FinishedAt); err != nil {
				return err
			}
		}
		if run.TriggerID == "" {
			return nil
		}
		return s.releaseSlot(ctx, tx, run)
	})
	if err != nil {
		return err
	}
	if failed && changed {
		if err := s.cfg.failpoint.At(ctx, failpointRunFailedCommitted); err != nil {
			return err
		}
	}
	switch {
	case duplicate:
		s.metrics.duplicates.WithLabelValues(ConsumerRuns).Inc()
	case unknown:
		// Runs requested by something other than a trigger share the
		// stream; they hold no slot.
		s.log.Debug().Str("run_id", data.RunID).Str("workflow", data.Workflow).Msg("finished run not launched by a trigger")
	case changed:
		s.kick()
		ev := s.log.Info().Str("run_id", run.ID).Str("workflow", run.Workflow).Str("trigger_id", run.TriggerID).
			Str("delivery_id", run.DeliveryID).Int("attempt", run.Attempt).Str("status", string(run.Status))
		if failed {
			s.metrics.runsFailed.WithLabelValues(run.TriggerID, run.LastErrorClass).Inc()
			ev = ev.Str("class", run.LastErrorClass).Str("node", run.CurrentNodeID)
		}
		if run.Status.Ended() {
			s.metrics.runsFinished.WithLabelValues(run.TriggerID, string(run.Status)).Inc()
		}
		ev.Msg("run " + p.Event)
	default:
		// A failure of an attempt that is no longer in flight, or an end
		// the run already had.
		s.metrics.duplicates.WithLabelValues(ConsumerRuns).Inc()
	}
	return nil
}

// unknownRun turns ErrNotFound into unknown and keeps other errors.
func unknownRun(err error, unknown *bool) error {
	if errors.Is(err, pgdb.ErrNotFound) {
		*unknown = true
		return nil
	}
	return err
}

// releaseSlot puts in tx's outbox the release of the one delivery of
// run's trigger that has waited longest for a concurrency slot (none
// waiting: the scheduler finds nothing). The run id names the release, so
// a finish applied twice releases once.
func (s *Service) releaseSlot(ctx context.Context, tx pgx.Tx, run triggerstore.Run) error {
	at := time.Now()
	if run.FinishedAt != nil {
		at = *run.FinishedAt
	}
	msg, err := contract.NewLifecycleMsg(EventSource, contract.Released, contract.ReleasedData{
		Kind: contract.KindEventTrigger, HoldKey: run.TriggerID, Reason: contract.ReleaseSlotFreed,
		By: "run " + run.ID, ReleasedAt: at.UTC(), HoldReason: contract.HoldConcurrency, Count: 1, ReleaseID: run.ID,
	}, at)
	if err != nil {
		return fmt.Errorf("build slot release: %w", err)
	}
	return outbox.Insert(ctx, tx, OutboxOwner, msg)
}
