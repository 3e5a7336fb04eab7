package triggers

import (
	"context"
	"errors"

	"github.com/jackc/pgx/v5"
	"github.com/nats-io/nats.go/jetstream"

	"github.com/retryd/retryd/pkg/contract"
	"github.com/retryd/retryd/projections/inbox"
	"github.com/retryd/retryd/projections/triggerstore"
)

// handleRunFinished marks a run completed or failed
// (runs.<workflow>.completed|failed.<run_id>), which frees its trigger's
// concurrency slot. Deliveries waiting for the slot launch at their next
// retry attempt; nothing is woken early, so no per-delivery state is kept.
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
		return err
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
		s.metrics.runsFinished.WithLabelValues(run.TriggerID, string(status)).Inc()
		s.log.Info().Str("run_id", run.ID).Str("workflow", run.Workflow).Str("trigger_id", run.TriggerID).
			Str("delivery_id", run.DeliveryID).Str("status", string(status)).Msg("run finished")
	default:
		s.metrics.duplicates.WithLabelValues(ConsumerRuns).Inc()
	}
	return nil
}
