package scheduler

import (
	"context"
	"errors"
	"fmt"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/nats-io/nats.go"

	"github.com/retryd/retryd/internal/audit"
	"github.com/retryd/retryd/internal/inbox"
	"github.com/retryd/retryd/pkg/contract"
	"github.com/retryd/retryd/pkg/errclass"
	"github.com/retryd/retryd/stores/pgdb"
	"github.com/retryd/retryd/stores/retrystore"
)

var (
	// ErrNotFound: no retry (or policy) with that key. It wraps
	// pgdb.ErrNotFound, so serve.WriteError answers 404.
	ErrNotFound = fmt.Errorf("retry %w", pgdb.ErrNotFound)
	// ErrConflict: the action does not fit the item's state (cancelling a
	// finished item, or a policy version that changed). It wraps
	// pgdb.ErrConflict (409).
	ErrConflict = fmt.Errorf("retry state %w", pgdb.ErrConflict)
	// ErrShards: the scheduler's shard count does not fit how RETRIES is
	// split (Start refuses to run).
	ErrShards = errors.New("shard count does not fit the RETRIES stream")
)

// MaxReasonLen bounds an operator's reason.
const MaxReasonLen = contract.MaxMessageLen

// RetryNowOptions are the options of a manual retry.
type RetryNowOptions struct {
	// Reason is recorded in the event and the history.
	Reason string
	// By names who asked (an operator, a service); default "operator".
	By string
	// ResetAttempts gives the item its full retry budget again. Attempt
	// numbers keep growing either way, so every due event id stays unique.
	ResetAttempts bool
	// ErrorClass, when set, is the error class (pkg/errclass) the operator
	// files the retry under (the jobs API's error_class, alias errorType):
	// the manual decision and its history entry carry it instead of the
	// item's last class, and the audit detail names it. The item's last
	// error class is left alone: it is what the item last failed with.
	ErrorClass string
}

func validateAction(kind, id, by, reason string) error {
	if err := contract.ValidateKind("kind", kind); err != nil {
		return err
	}
	if err := contract.ValidateID("id", id); err != nil {
		return err
	}
	if len(by) > contract.MaxTokenLen {
		return &contract.FieldError{Field: "by", Reason: fmt.Sprintf("is longer than %d characters", contract.MaxTokenLen), Err: contract.ErrInvalid}
	}
	if len(reason) > MaxReasonLen {
		return &contract.FieldError{Field: "reason", Reason: fmt.Sprintf("is longer than %d bytes", MaxReasonLen), Err: contract.ErrInvalid}
	}
	return nil
}

// Cancel cancels a pending retry: it publishes cancelled (through the
// outbox) and no due follows. Cancelling a retry that is due (its owner
// is running the attempt) works too: the owner's later failed is ignored
// as stale. ErrNotFound when the item has no retry, ErrConflict when it is
// already finished.
func (s *Scheduler) Cancel(ctx context.Context, kind, id, by, reason string) (retrystore.Retry, error) {
	if by == "" {
		by = "operator"
	}
	if err := validateAction(kind, id, by, reason); err != nil {
		return retrystore.Retry{}, err
	}
	return s.action(ctx, kind, id, func(tx pgx.Tx, row *retrystore.Retry, now time.Time) (change, error) {
		if !pending(row) {
			return change{}, fmt.Errorf("cancel %s/%s: it is in state %s, not pending: %w", kind, id, row.State, ErrConflict)
		}
		cd := &contract.CancelledData{Kind: kind, ID: id, Attempt: row.Attempt, By: by, Reason: reason}
		msg, err := contract.NewLifecycleMsg(source, contract.Cancelled, cd, now)
		if err != nil {
			return change{}, err
		}
		msgID := msg.Header.Get(contract.HeaderMsgID)
		// The event comes back to this scheduler's consumer: claiming it
		// now makes that delivery a duplicate.
		if _, err := inbox.Claim(ctx, tx, Owner, msgID); err != nil {
			return change{}, err
		}
		ch := applyCancelled(row, fact{ev: contract.LifecycleEvent{Kind: kind, ID: id, Event: contract.Cancelled, Cancelled: cd}, msgID: msgID, at: now})
		ch.msgs = append(ch.msgs, msg)
		return ch, audit.Record(ctx, tx, audit.ActionName(ctx, audit.RetryCancel), auditTarget(ctx, kind, id),
			audit.Detail{"reason": reason, "attempt": row.Attempt})
	})
}

// RetryNow schedules a new attempt of an item now, whatever its state
// (exhausted and cancelled included), and publishes rescheduled with
// decided_by "manual". The new attempt is the row's attempt plus one. A
// retry that was waiting is replaced without using up budget; with
// ResetAttempts the item gets its full budget back.
func (s *Scheduler) RetryNow(ctx context.Context, kind, id string, opts RetryNowOptions) (retrystore.Retry, error) {
	if opts.By == "" {
		opts.By = "operator"
	}
	if err := validateAction(kind, id, opts.By, opts.Reason); err != nil {
		return retrystore.Retry{}, err
	}
	if opts.ErrorClass != "" {
		c, err := errclass.Parse(opts.ErrorClass)
		if err != nil {
			return retrystore.Retry{}, &contract.FieldError{Field: "error_class", Reason: err.Error(), Err: contract.ErrInvalid}
		}
		opts.ErrorClass = string(c)
	}
	return s.action(ctx, kind, id, func(tx pgx.Tx, row *retrystore.Retry, now time.Time) (change, error) {
		ch, err := manualRetry(*row, opts, now)
		if err != nil {
			return change{}, err
		}
		d := audit.Detail{"reason": opts.Reason, "attempt": ch.row.Attempt}
		if opts.ResetAttempts {
			d["reset_attempts"] = true
		}
		if opts.ErrorClass != "" {
			d["error_class"] = opts.ErrorClass
		}
		return ch, audit.Record(ctx, tx, audit.ActionName(ctx, audit.RetryRetry), auditTarget(ctx, kind, id), d)
	})
}

// auditTarget names kind/id in the audit trail: retry/<kind>/<id>, or
// job/<id> when the jobs API named the action (audit.Named).
func auditTarget(ctx context.Context, kind, id string) string {
	if a := audit.ActionName(ctx, ""); a == audit.JobCancel || a == audit.JobRetry {
		return "job/" + id
	}
	return "retry/" + kind + "/" + id
}

// manualRetry is the change of a manual retry.
func manualRetry(r retrystore.Retry, opts RetryNowOptions, now time.Time) (change, error) {
	attempt := r.Attempt + 1
	base := r.BudgetBase
	if r.State == retrystore.StateScheduled {
		base++ // the waiting attempt is replaced, not used
	}
	if opts.ResetAttempts {
		base = attempt - 1
	}
	note := "manual retry by " + opts.By
	if opts.ResetAttempts {
		note += ", attempts reset"
	}
	if opts.ErrorClass != "" {
		note += ", error class " + opts.ErrorClass
	}
	if opts.Reason != "" {
		note += ": " + opts.Reason
	}
	class := r.LastErrorClass
	if opts.ErrorClass != "" {
		class = opts.ErrorClass
	}
	sd := &contract.ScheduledData{
		Kind: r.Kind, ID: r.ItemID, Attempt: attempt, NextAttemptAt: now,
		JobType: r.JobType, Source: r.Source,
		Decision: contract.Decision{
			Policy: r.PolicyName, PolicyVersion: r.PolicyVersion, DecidedBy: contract.DecidedByManual,
			ErrorClass: class, RetryCount: max(attempt-1-base, 0), MaxRetries: r.MaxRetries, Note: note,
		},
	}
	msg, err := contract.NewLifecycleMsg(source, contract.Rescheduled, sd, now)
	if err != nil {
		return change{}, err
	}
	applyScheduleDecision(&r, sd)
	h := scheduledEntry(&r, contract.Rescheduled, sd, msg.Header.Get(contract.HeaderMsgID), now)
	return change{row: &r, history: []retrystore.HistoryEntry{h}, msgs: []*nats.Msg{msg}, outcome: contract.Rescheduled}, nil
}

// action runs an operator action in a transaction on the locked row, then
// publishes its events and wakes the due loop.
func (s *Scheduler) action(ctx context.Context, kind, id string, do func(tx pgx.Tx, row *retrystore.Retry, now time.Time) (change, error)) (retrystore.Retry, error) {
	tx, err := s.begin(ctx)
	if err != nil {
		return retrystore.Retry{}, err
	}
	defer tx.Rollback(context.WithoutCancel(ctx)) //nolint:errcheck // no-op after commit
	now, err := retrystore.DBNow(ctx, tx)
	if err != nil {
		return retrystore.Retry{}, err
	}
	row, err := lockRow(ctx, tx, kind, id)
	if err != nil {
		return retrystore.Retry{}, err
	}
	if row == nil {
		return retrystore.Retry{}, fmt.Errorf("%s/%s: %w", kind, id, ErrNotFound)
	}
	ch, err := do(tx, row, now)
	if err != nil {
		return retrystore.Retry{}, err
	}
	if err := write(ctx, tx, ch); err != nil {
		return retrystore.Retry{}, err
	}
	if err := tx.Commit(ctx); err != nil {
		return retrystore.Retry{}, fmt.Errorf("commit: %w", err)
	}
	// Publish before answering: when the operator gets the response, the
	// event is in RETRIES (unless NATS is unreachable; the relay then
	// publishes it later).
	if _, err := s.relay.Flush(ctx); err != nil {
		s.log.Warn().Err(err).Msg("publish operator action; the relay retries")
		s.relay.Kick()
	}
	s.metrics.outcome(ch.outcome, kind)
	if ch.outcome == contract.Exhausted {
		s.metrics.exhaustedRow(ch.row)
	}
	r := *ch.row
	if r.State == retrystore.StateScheduled && r.NextAttemptAt != nil {
		s.wakeDueLoop(r.NextAttemptAt.UnixNano())
	}
	detail := ""
	if len(ch.history) > 0 {
		detail = string(ch.history[len(ch.history)-1].Event)
	}
	s.log.Info().Str("kind", kind).Str("id", id).Int("attempt", r.Attempt).Str("state", string(r.State)).
		Str("action", detail).Msg("operator action")
	return r, nil
}

// isNotFound reports a missing row or policy from the store.
func isNotFound(err error) bool { return errors.Is(err, pgdb.ErrNotFound) }
