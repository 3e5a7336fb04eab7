package scheduler

import (
	"context"
	"encoding/json"
	"fmt"
	"time"

	"github.com/jackc/pgx/v5"

	"github.com/retryd/retryd/internal/inbox"
	"github.com/retryd/retryd/pkg/contract"
	"github.com/retryd/retryd/pkg/policy"
	"github.com/retryd/retryd/stores/retrystore"
)

// heldFact returns the hold a fact reports: a held event, or a failed
// event with one of the reasons owners used for holds before the held
// event existed (so the stream's history and owners not upgraded yet
// keep their budget too).
func heldFact(f fact) (*contract.HeldData, bool) {
	if f.ev.Held != nil {
		return f.ev.Held, true
	}
	fd := f.ev.Failed
	if fd == nil {
		return nil, false
	}
	reason, ok := contract.LegacyHoldReason(fd.Reason)
	if !ok {
		return nil, false
	}
	hd := &contract.HeldData{
		Kind: fd.Kind, ID: fd.ID, Attempt: fd.Attempt, Reason: reason, Detail: fd.Error.Message,
		JobType: fd.JobType, Source: fd.Source, Payload: fd.Payload, Checkpoint: fd.Checkpoint, Metadata: fd.Metadata,
		Executor: fd.Executor,
	}
	if fd.RetryAfter != nil {
		until := f.at.Add(fd.RetryAfter.Delay(f.at))
		hd.Until = &until
	}
	if reason == contract.HoldPause {
		hd.HoldKey = fd.Source
	}
	return hd, true
}

// applyHeld records a hold and decides when the item is looked at again.
func (s *Scheduler) applyHeld(ctx context.Context, tx pgx.Tx, d *decider, row *retrystore.Retry, f fact, hd *contract.HeldData, now time.Time) (change, error) {
	if !acceptsFailure(row, hd.Attempt) {
		return staleChange(), nil
	}
	var history []retrystore.HistoryEntry
	if due, ok := lateDue(row, hd.Attempt, f.at); ok {
		history = append(history, due)
	}
	r, h := recordHold(row, f, hd)
	hold, err := holdOf(ctx, tx, &r, hd, f.at)
	if err != nil {
		return change{}, err
	}
	return d.decide(ctx, tx, r, failure{hold: hold, message: hd.Detail}, append(history, h), now)
}

// holdOf is the policy's view of hold hd of row r, decided at heldAt. A
// hold whose key was released at or after heldAt (a resume that overtook
// this fact) is released already.
func holdOf(ctx context.Context, q retrystore.Querier, r *retrystore.Retry, hd *contract.HeldData, heldAt time.Time) (*policy.Hold, error) {
	h := &policy.Hold{Reason: hd.Reason}
	if r.HeldSince != nil {
		h.Since = *r.HeldSince
	}
	if hd.Until != nil {
		h.Until = *hd.Until
	}
	if hd.HoldKey != "" {
		released, err := retrystore.ReleasedAfter(ctx, q, r.Kind, hd.HoldKey, hd.Reason, heldAt)
		if err != nil {
			return nil, err
		}
		h.Released = released
	}
	return h, nil
}

// recordHold copies a hold into the row and returns the held history
// entry. The row is left awaiting its decision, as recordFailure leaves it;
// the retry count is the row's, the error fields are kept (a hold is not
// an error), and held_since is kept while the item stays held.
func recordHold(row *retrystore.Retry, f fact, hd *contract.HeldData) (retrystore.Retry, retrystore.HistoryEntry) {
	r := rowOf(row, f)
	keepWork(&r, hd.JobType, hd.Source, hd.Payload, hd.Checkpoint, hd.Metadata)
	keepOverrides(&r, hd.MaxRetries, hd.RetryEnabled, hd.TimeoutMS, hd.Priority)
	awaitDecision(&r, hd.Attempt, hd.Reason)
	if r.HeldSince == nil {
		at := f.at
		r.HeldSince = &at
	}
	r.HoldReason, r.HoldKey = hd.Reason, hd.HoldKey
	// The owner's end of the hold, if it gave one; the decision settles
	// what the views show (applyScheduleDecision).
	r.HoldUntil = hd.Until

	h := entry(&r, hd.Attempt, contract.Held, f.msgID, f.at)
	h.Executor = hd.Executor
	h.Detail = heldDetail(hd)
	return r, h
}

// heldDetailJSON keeps what the decision of a hold used, so a rebuild can
// decide for a hold whose decision never reached the stream.
type heldDetailJSON struct {
	Reason  string     `json:"reason"`
	Until   *time.Time `json:"until,omitempty"`
	HoldKey string     `json:"hold_key,omitempty"`
	Detail  string     `json:"detail,omitempty"`
}

func heldDetail(hd *contract.HeldData) json.RawMessage {
	b, _ := json.Marshal(heldDetailJSON{Reason: hd.Reason, Until: hd.Until, HoldKey: hd.HoldKey, Detail: hd.Detail})
	return b
}

// handleRelease applies a release fact in its own transaction: it is
// recorded (for holds that overtook it) and every hold under its key
// comes due, set-based, in the order the items were first held. A
// release of every hold is applied a part at a time (releaseparts.go):
// the first part here, the rest by the release loop. No timer or entry
// per held item exists anywhere: the rows carry the hold key.
func (s *Scheduler) handleRelease(ctx context.Context, in inbound) {
	rd := in.f.ev.Released
	var rel retrystore.Released
	var duplicate, more bool
	err := func() error {
		tx, err := s.begin(ctx)
		if err != nil {
			return err
		}
		defer tx.Rollback(context.WithoutCancel(ctx)) //nolint:errcheck // no-op after commit
		first, err := inbox.Claim(ctx, tx, Owner, in.f.msgID)
		if err != nil {
			return err
		}
		if duplicate = !first; duplicate {
			return nil
		}
		// A hold decided before this release and applied after it is
		// released as it is applied. For a partial release (a freed slot)
		// that may release one more than the count: it looks again and
		// waits again, which costs a due and no retry, where missing it
		// would leave it waiting for its backoff.
		if err := retrystore.RecordRelease(ctx, tx, rd.Kind, rd.HoldKey, rd.HoldReason, rd.ReleasedAt); err != nil {
			return err
		}
		if rd.Count > 0 {
			rel, err = retrystore.ReleaseHolds(ctx, tx, in.f.msgID, *rd, s.cfg.RedueAfter)
			if err != nil {
				return err
			}
		} else if rel, more, err = s.releaseFirstPart(ctx, tx, in.f.msgID, *rd); err != nil {
			return err
		}
		if err := tx.Commit(ctx); err != nil {
			return fmt.Errorf("commit: %w", err)
		}
		return nil
	}()
	if err != nil {
		s.metrics.errors.WithLabelValues("policy").Inc()
		if ctx.Err() != nil {
			return
		}
		s.log.Error().Err(err).Str("kind", rd.Kind).Str("hold_key", rd.HoldKey).Msg("apply release failed, redelivering later")
		_ = in.msg.NakWithDelay(nakDelay)
		return
	}
	if more {
		s.wakeReleaseLoop()
	}
	switch {
	case duplicate:
		s.metrics.duplicate.WithLabelValues(Owner).Inc()
	case more:
		if rel.Rows > 0 {
			s.wakeDueLoop(rel.First.UnixNano())
		}
		s.log.Info().Str("kind", rd.Kind).Str("hold_key", rd.HoldKey).Int64("released", rel.Rows).
			Str("reason", rd.Reason).Msg("holds release started; the release loop applies the rest in parts")
	case rel.Rows > 0:
		s.wakeDueLoop(rel.First.UnixNano())
		s.log.Info().Str("kind", rd.Kind).Str("hold_key", rd.HoldKey).Int64("released", rel.Rows).
			Str("reason", rd.Reason).Msg("holds released")
	default:
		s.log.Debug().Str("kind", rd.Kind).Str("hold_key", rd.HoldKey).Msg("release found nothing held")
	}
	if err := in.msg.Ack(); err != nil {
		s.log.Debug().Err(err).Str("subject", in.msg.Subject()).Msg("ack failed; the redelivery will be a duplicate")
	}
}
