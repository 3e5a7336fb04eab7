package scheduler

import (
	"context"
	"errors"
	"fmt"
	"time"

	"github.com/nats-io/nats.go"

	"github.com/retryd/retryd/pkg/backoff"
	"github.com/retryd/retryd/pkg/contract"
	"github.com/retryd/retryd/pkg/errclass"
	"github.com/retryd/retryd/pkg/policy"
	"github.com/retryd/retryd/stores/pgdb"
	"github.com/retryd/retryd/stores/retrystore"
)

// builtinPolicy governs kinds when even the "*" policy row was deleted:
// the fallback the migrations install, under its own name so that its
// decisions show it, so deleting that row cannot leave a kind without a
// policy.
var builtinPolicy = func() policy.Policy {
	p := policy.Fallback()
	p.Name = "builtin-default"
	return p
}()

// policyCache memoises policy lookups inside one transaction, so a batch
// of failures of one kind reads the policy once and a policy update is
// seen by the next transaction.
type policyCache map[[2]string]policy.Policy

func (c policyCache) lookup(ctx context.Context, q retrystore.Querier, kind, jobType string) (policy.Policy, error) {
	key := [2]string{kind, jobType}
	if p, ok := c[key]; ok {
		return p, nil
	}
	p, err := retrystore.LookupPolicy(ctx, q, kind, jobType)
	switch {
	case errors.Is(err, pgdb.ErrNotFound):
		p = builtinPolicy
	case err != nil:
		return policy.Policy{}, err
	}
	c[key] = p
	return p, nil
}

// classify returns the class of a failure: the owner's class when it names
// one, otherwise what the classifier makes of the message.
func classify(c *errclass.Classifier, e contract.ErrorInfo) errclass.Class {
	if e.Class != "" {
		if cl, err := errclass.Parse(e.Class); err == nil {
			return cl
		}
	}
	return c.ClassifyMessage(e.Message)
}

// failure is what a decision needs to know about a failure, or a hold,
// beyond the row.
type failure struct {
	class      errclass.Class
	message    string
	retryAfter *contract.RetryAfter
	// nonRetryable is the owner's word that this failure is final whatever
	// its class (contract.ErrorInfo.NonRetryable).
	nonRetryable bool
	// hold makes this a hold, decided by its own rules (policy.Hold).
	hold *policy.Hold
}

// decider makes retry decisions; shared by the policy stage and the
// rebuild.
type decider struct {
	rand     backoff.Rand
	policies policyCache
}

// decide applies the policy to a row that recorded a failure (see
// recordFailure) and returns the change: the row scheduled for the next
// attempt with a scheduled/rescheduled event, or exhausted with an
// exhausted event. now is the database clock the delay counts from.
func (d *decider) decide(ctx context.Context, q retrystore.Querier, r retrystore.Retry, f failure, hist []retrystore.HistoryEntry, now time.Time) (change, error) {
	pol, err := d.policies.lookup(ctx, q, r.Kind, r.JobType)
	if err != nil {
		return change{}, err
	}
	in := policy.Input{
		Attempt: r.Attempt, RetryCount: r.RetryCount, FailedAt: now, Class: f.class,
		RetryAfter: f.retryAfter, Hold: f.hold, MaxRetriesOverride: r.MaxRetriesOverride,
		NonRetryable: f.nonRetryable,
	}
	if !r.RetryEnabled {
		disabled := false
		in.RetryEnabledOverride = &disabled
	}
	out := policy.Decide(pol, in, d.rand)
	if out.Retry {
		ev := contract.Rescheduled
		if r.Attempt == 1 {
			ev = contract.Scheduled
		}
		sd := &contract.ScheduledData{
			Kind: r.Kind, ID: r.ItemID, Attempt: out.NextAttempt,
			NextAttemptAt: out.NextAttemptAt.Truncate(time.Microsecond),
			JobType:       r.JobType, Source: r.Source, Decision: out.Decision,
		}
		msg, err := contract.NewLifecycleMsg(source, ev, sd, now)
		if err != nil {
			return change{}, fmt.Errorf("build %s event: %w", ev, err)
		}
		applyScheduleDecision(&r, sd)
		msgID := contract.LifecycleMsgID(r.Kind, ev, r.ItemID, sd.Attempt)
		hist = append(hist, scheduledEntry(&r, ev, sd, msgID, now))
		return change{row: &r, history: hist, msgs: []*nats.Msg{msg}, outcome: ev}, nil
	}
	message := f.message
	if out.ExhaustedReason == contract.ExhaustedHoldExpired {
		message = out.Decision.Note
	}
	ed := &contract.ExhaustedData{
		Kind: r.Kind, ID: r.ItemID, Attempt: r.Attempt, Reason: out.ExhaustedReason,
		Error:      contract.ErrorInfo{Class: out.Decision.ErrorClass, Message: message},
		RetryCount: out.Decision.RetryCount, MaxRetries: out.Decision.MaxRetries,
		Policy: out.Decision.Policy, PolicyVersion: out.Decision.PolicyVersion,
		JobType: r.JobType, Source: r.Source,
	}
	msg, err := contract.NewLifecycleMsg(source, contract.Exhausted, ed, now)
	if err != nil {
		return change{}, fmt.Errorf("build exhausted event: %w", err)
	}
	applyExhaustDecision(&r, ed, now)
	msgID := contract.LifecycleMsgID(r.Kind, contract.Exhausted, r.ItemID, ed.Attempt)
	hist = append(hist, exhaustedEntry(&r, ed, msgID, now))
	return change{row: &r, history: hist, msgs: []*nats.Msg{msg}, outcome: contract.Exhausted}, nil
}
