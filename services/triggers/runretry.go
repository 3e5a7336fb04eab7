package triggers

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/nats-io/nats.go/jetstream"

	"github.com/retryd/retryd/internal/durable"
	"github.com/retryd/retryd/internal/inbox"
	"github.com/retryd/retryd/internal/lifecyclemsg"
	"github.com/retryd/retryd/internal/outbox"
	"github.com/retryd/retryd/pkg/contract"
	"github.com/retryd/retryd/pkg/errclass"
	"github.com/retryd/retryd/services/triggers/internal/triggerstore"
	"github.com/retryd/retryd/stores/pgdb"
)

// ConsumerRunRetries reads the scheduler's facts about runs (kind run):
// the due that launches a run again, and the decisions that say when, or
// that it will not.
const ConsumerRunRetries = "triggers-run-retries"

// slotWait is how long a due for a run that ended waits before it asks
// for a slot again: an operator's retry of a failed run takes a slot like
// a new run and never goes over the trigger's max concurrency.
const slotWait = time.Second

// runRetryFilters are the subjects of ConsumerRunRetries.
func runRetryFilters() []string {
	var out []string
	for _, l := range []contract.Lifecycle{contract.Due, contract.Scheduled, contract.Rescheduled, contract.Exhausted, contract.Cancelled} {
		out = append(out, contract.RetryFilter(contract.KindRun, l))
	}
	return out
}

// handleRunStep records a node's report (runs.<workflow>.step.<run_id>)
// in workflow_run_steps: the completed ones are the checkpoint a retry
// resumes from.
func (s *Service) handleRunStep(ctx context.Context, msg jetstream.Msg) error {
	env, d, err := contract.DecodeRunStep(msg.Subject(), msg.Data())
	if err != nil {
		return err
	}
	var recorded, unknown bool
	err = pgx.BeginFunc(ctx, s.cfg.Pool, func(tx pgx.Tx) error {
		recorded, unknown = false, false
		claimed, err := inbox.Claim(ctx, tx, ConsumerRuns, lifecyclemsg.InboxID(msg, env))
		if err != nil || !claimed {
			return err
		}
		_, recorded, err = triggerstore.RecordStep(ctx, tx, d, stepTime(env))
		if errors.Is(err, pgdb.ErrNotFound) {
			unknown = true
			return nil
		}
		return err
	})
	if err != nil {
		return err
	}
	switch {
	case unknown:
		s.log.Debug().Str("run_id", d.RunID).Str("workflow", d.Workflow).Msg("step of a run not launched by a trigger")
	case recorded:
		s.metrics.steps.WithLabelValues(d.Status).Inc()
		s.log.Debug().Str("run_id", d.RunID).Str("node", d.Node).Int("attempt", max(d.Attempt, 1)).
			Str("status", d.Status).Msg("run step")
	default:
		s.metrics.duplicates.WithLabelValues(ConsumerRuns).Inc()
	}
	return nil
}

// stepTime orders a run's nodes: when the executor sent the first report
// of each (reports are applied concurrently, not in order).
func stepTime(env contract.Envelope) time.Time {
	if env.Time.IsZero() {
		return time.Now()
	}
	return env.Time
}

// runFailure is the retry fact of a failed attempt of run: its error,
// the checkpoint a retry resumes from, and what the run's views need.
func (s *Service) runFailure(ctx context.Context, tx pgx.Tx, run triggerstore.Run, e contract.ErrorInfo, now time.Time) error {
	cp, err := triggerstore.Checkpoint(ctx, tx, run.ID)
	if err != nil {
		return err
	}
	fd := contract.FailedData{
		Kind: contract.KindRun, ID: run.ID, Attempt: run.Attempt, Error: e,
		Metadata: map[string]string{"workflow": run.Workflow, "trigger_id": run.TriggerID},
		Executor: run.Executor,
	}
	if run.CurrentNodeID != "" {
		fd.Metadata["node"] = run.CurrentNodeID
	}
	if cp != nil {
		if fd.Checkpoint, err = json.Marshal(cp); err != nil {
			return fmt.Errorf("marshal checkpoint: %w", err)
		}
	}
	msg, err := contract.NewLifecycleMsg(EventSource, contract.Failed, fd, now)
	if err != nil {
		return fmt.Errorf("build run failure: %w", err)
	}
	return outbox.Insert(ctx, tx, OutboxOwner, msg)
}

// failedAttempt reports the failed attempt of a run FailRun or the lease
// loop moved to retrying; a run they ended (its retries were cancelled)
// frees its slot instead.
func (s *Service) failedAttempt(ctx context.Context, tx pgx.Tx, run triggerstore.Run, e contract.ErrorInfo, now time.Time) error {
	if run.Status != triggerstore.RunFailed {
		return s.runFailure(ctx, tx, run, e, now)
	}
	if run.TriggerID == "" {
		return nil
	}
	return s.releaseSlot(ctx, tx, run)
}

// runSucceeded closes the scheduler's retry of a run that completed.
func (s *Service) runSucceeded(ctx context.Context, tx pgx.Tx, run triggerstore.Run, now time.Time) error {
	msg, err := contract.NewLifecycleMsg(EventSource, contract.Succeeded, contract.SucceededData{
		Kind: contract.KindRun, ID: run.ID, Attempt: run.Attempt, Executor: run.Executor,
		Metadata: map[string]string{"workflow": run.Workflow, "trigger_id": run.TriggerID},
	}, now)
	if err != nil {
		return fmt.Errorf("build run success: %w", err)
	}
	return outbox.Insert(ctx, tx, OutboxOwner, msg)
}

// timeoutError is the error of an attempt whose lease ended.
func timeoutError() contract.ErrorInfo {
	return contract.ErrorInfo{Class: string(errclass.Timeout), Message: triggerstore.RunTimeoutReason + ": no heartbeat and no end within the run timeout"}
}

// handleRunRetry applies the scheduler's facts about a run.
func (s *Service) handleRunRetry(ctx context.Context, msg jetstream.Msg) error {
	ev, err := lifecyclemsg.Decode(msg, contract.KindRun)
	if err != nil {
		return err
	}
	if ev.Due != nil {
		return s.relaunch(ctx, lifecyclemsg.InboxID(msg, ev.Envelope), *ev.Due)
	}
	var (
		applied bool
		run     triggerstore.Run
	)
	err = pgx.BeginFunc(ctx, s.cfg.Pool, func(tx pgx.Tx) error {
		applied = false
		claimed, err := inbox.Claim(ctx, tx, ConsumerRunRetries, lifecyclemsg.InboxID(msg, ev.Envelope))
		if err != nil || !claimed {
			return err
		}
		switch {
		case ev.Scheduled != nil:
			sd := ev.Scheduled
			mr := sd.Decision.MaxRetries
			applied, err = triggerstore.ScheduleRunRetry(ctx, tx, ev.ID, sd.Attempt-1, sd.NextAttemptAt, sd.Decision.RetryCount, &mr, map[string]any{
				"policy": sd.Decision.Policy, "policy_version": sd.Decision.PolicyVersion,
				"decided_by": sd.Decision.DecidedBy, "delay_ms": sd.Decision.DelayMS,
			})
			return err
		case ev.Exhausted != nil:
			x := ev.Exhausted
			status := triggerstore.RunFailed
			if x.Reason == contract.ExhaustedMaxRetries {
				status = triggerstore.RunFailedMaxRetries
			}
			mr := x.MaxRetries
			run, applied, err = triggerstore.EndRun(ctx, tx, ev.ID, status, "exhausted: "+x.Reason, x.RetryCount, &mr)
		case ev.Cancelled != nil:
			run, applied, err = triggerstore.EndRun(ctx, tx, ev.ID, triggerstore.RunFailed, "cancelled by "+ev.Cancelled.By, 0, nil)
			if err == nil && !applied {
				// An attempt is in flight: it is not stopped, but it is
				// the last.
				stopped, err := triggerstore.StopRunRetries(ctx, tx, ev.ID)
				if err != nil || !stopped {
					return err
				}
				applied = true
				return nil
			}
		default:
			return invalidField("subject", fmt.Sprintf("%q is not due, scheduled, rescheduled, exhausted or cancelled", msg.Subject()))
		}
		if errors.Is(err, pgdb.ErrNotFound) {
			return nil
		}
		if err != nil || !applied || run.TriggerID == "" {
			return err
		}
		return s.releaseSlot(ctx, tx, run)
	})
	if err != nil {
		return err
	}
	if !applied {
		s.metrics.duplicates.WithLabelValues(ConsumerRunRetries).Inc()
		return nil
	}
	if run.Status.Ended() {
		s.kick()
		s.metrics.runsFinished.WithLabelValues(run.TriggerID, string(run.Status)).Inc()
		s.log.Warn().Str("run_id", run.ID).Str("workflow", run.Workflow).Str("trigger_id", run.TriggerID).
			Int("attempt", run.Attempt).Str("status", string(run.Status)).Str("error", run.Error).Msg("run ended without success")
	}
	return nil
}

// relaunch starts the attempt a due brings: the run is requested again,
// from the due's checkpoint, with the event its first request carried.
func (s *Service) relaunch(ctx context.Context, inboxID string, due contract.DueData) error {
	run, err := triggerstore.GetRun(ctx, s.cfg.Pool, due.ID)
	if errors.Is(err, pgdb.ErrNotFound) {
		s.log.Warn().Str("run_id", due.ID).Int("attempt", due.Attempt).Msg("due for a run triggers does not have; ignored")
		return nil
	}
	if err != nil {
		return err
	}
	event := s.requestedEvent(ctx, run)
	var (
		changed, full bool
		now           time.Time
	)
	err = pgx.BeginFunc(ctx, s.cfg.Pool, func(tx pgx.Tx) error {
		changed, full = false, false
		claimed, err := inbox.Claim(ctx, tx, ConsumerRunRetries, inboxID)
		if err != nil || !claimed {
			return err
		}
		if run, changed, full, err = triggerstore.RelaunchRun(ctx, tx, due.ID, due.Attempt, s.cfg.RunTimeout); err != nil {
			return err
		}
		if full {
			// Rolled back with the claim: the due comes again.
			return durable.NakAfter(slotWait)
		}
		if now, err = triggerstore.Now(ctx, tx); err != nil {
			return err
		}
		if !changed {
			if run.Status == triggerstore.RunCompleted {
				// An operator's retry of a run that completed: nothing
				// to run, and the scheduler's retry is closed rather than
				// left due.
				run.Attempt = due.Attempt
				return s.runSucceeded(ctx, tx, run, now)
			}
			return nil
		}
		req := contract.RunRequestedData{
			RunID: run.ID, Workflow: run.Workflow, TriggerID: run.TriggerID, DeliveryID: run.DeliveryID,
			EventID: run.EventID, Event: event, Attempt: due.Attempt,
		}
		if req.ResumeFrom, err = resumePoint(ctx, tx, run.ID, due.Checkpoint); err != nil {
			return err
		}
		if d, err := triggerstore.GetDelivery(ctx, tx, run.DeliveryID); err == nil {
			req.TriggerVersion = d.TriggerVersion
		}
		msg, err := contract.NewRunMsg(EventSource, contract.RunRequested, req, now)
		if errors.Is(err, contract.ErrTooLarge) && len(req.Event) > 0 {
			// The event and the outputs together are too large: the
			// executor gets the event id and reads the event itself.
			req.Event = nil
			msg, err = contract.NewRunMsg(EventSource, contract.RunRequested, req, now)
		}
		if err != nil {
			return err
		}
		return outbox.Insert(ctx, tx, OutboxOwner, msg)
	})
	if err != nil {
		return err
	}
	if !changed {
		s.metrics.duplicates.WithLabelValues(ConsumerRunRetries).Inc()
		return nil
	}
	if err := s.cfg.failpoint.At(ctx, failpointRelaunchCommitted); err != nil {
		return err
	}
	s.kick()
	s.metrics.runsRetried.WithLabelValues(run.TriggerID).Inc()
	s.log.Info().Str("run_id", run.ID).Str("workflow", run.Workflow).Str("trigger_id", run.TriggerID).
		Int("attempt", due.Attempt).Msg("run launched again")
	return nil
}

// resumePoint is where the attempt resumes: the checkpoint the recorded
// steps make now, or, when they make none, the one the due brought back.
// The steps come first because reports are applied concurrently: a
// failure can be applied before the last node's completion, and then the
// checkpoint it sent the scheduler lacks that node.
func resumePoint(ctx context.Context, tx pgx.Tx, runID string, raw json.RawMessage) (*contract.RunCheckpoint, error) {
	cp, err := triggerstore.Checkpoint(ctx, tx, runID)
	if err != nil || cp != nil || len(raw) == 0 {
		return cp, err
	}
	var due contract.RunCheckpoint
	if err := json.Unmarshal(raw, &due); err != nil || due.Node == "" {
		return nil, nil
	}
	return &due, nil
}

// requestedEvent is the event the run's last requested message carried,
// read back from RUNS: triggers keeps no copy of a launched delivery's
// event. Nil when RUNS no longer has it (the executor then gets the
// event id only).
func (s *Service) requestedEvent(ctx context.Context, run triggerstore.Run) json.RawMessage {
	stream, err := s.cfg.JS.Stream(ctx, contract.StreamRuns)
	if err == nil {
		var m *jetstream.RawStreamMsg
		m, err = stream.GetLastMsgForSubject(ctx, contract.RunSubject(run.Workflow, contract.RunRequested, run.ID))
		if err == nil {
			var d contract.RunRequestedData
			if _, d, err = contract.DecodeRunRequested(m.Subject, m.Data); err == nil {
				return d.Event
			}
		}
	}
	s.log.Warn().Err(err).Str("run_id", run.ID).Msg("the run's event is not in RUNS; its retry carries the event id only")
	return nil
}
