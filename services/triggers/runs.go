package triggers

import (
	"context"
	"errors"
	"fmt"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/nats-io/nats.go/jetstream"

	"github.com/retryd/retryd/pkg/contract"
	"github.com/retryd/retryd/projections/inbox"
	"github.com/retryd/retryd/projections/outbox"
	"github.com/retryd/retryd/services/triggers/internal/triggerstore"
)

// handleRun routes a message of the triggers-runs consumer by its
// subject's event: a run's end or a heartbeat.
func (s *Service) handleRun(ctx context.Context, msg jetstream.Msg) error {
	p, err := contract.ParseRunSubject(msg.Subject())
	if err != nil {
		return err
	}
	if p.Event == contract.RunHeartbeat {
		return s.handleHeartbeat(ctx, msg)
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
	case errors.Is(err, triggerstore.ErrNotFound):
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

// handleRunFinished marks a run completed or failed
// (runs.<workflow>.completed|failed.<run_id>), which frees its trigger's
// concurrency slot, and in the same transaction puts
// retry.event-trigger.released.<trigger_id> in the outbox: the scheduler
// makes the delivery that has waited longest for a slot due at once. No
// per-delivery state is kept anywhere: the held rows carry the trigger id
// as their hold key.
func (s *Service) handleRunFinished(ctx context.Context, msg jetstream.Msg) error {
	env, data, err := contract.DecodeRunFinished(msg.Subject(), msg.Data())
	if err != nil {
		return err
	}
	p, err := contract.ParseRunSubject(msg.Subject())
	if err != nil {
		return err
	}
	status := triggerstore.RunCompleted
	errText := ""
	if p.Event == contract.RunFailed {
		status = triggerstore.RunFailed
		errText = "run failed"
		if data.Error != nil && data.Error.Class != "" {
			errText = "run failed: " + data.Error.Class
		}
	}
	var (
		run       triggerstore.Run
		changed   bool
		duplicate bool
		unknown   bool
	)
	err = pgx.BeginFunc(ctx, s.cfg.Pool, func(tx pgx.Tx) error {
		changed, duplicate, unknown = false, false, false
		claimed, err := inbox.Claim(ctx, tx, ConsumerRuns, msgID(msg, env))
		if err != nil {
			return err
		}
		if !claimed {
			duplicate = true
			return nil
		}
		run, changed, err = triggerstore.FinishRun(ctx, tx, data.RunID, status, errText)
		if errors.Is(err, triggerstore.ErrNotFound) {
			unknown = true
			return nil
		}
		if err != nil || !changed || run.TriggerID == "" {
			return err
		}
		return s.releaseSlot(ctx, tx, run)
	})
	if err != nil {
		return err
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
		s.metrics.runsFinished.WithLabelValues(run.TriggerID, string(status)).Inc()
		s.log.Info().Str("run_id", run.ID).Str("workflow", run.Workflow).Str("trigger_id", run.TriggerID).
			Str("delivery_id", run.DeliveryID).Str("status", string(status)).Msg("run finished")
	default:
		s.metrics.duplicates.WithLabelValues(ConsumerRuns).Inc()
	}
	return nil
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
