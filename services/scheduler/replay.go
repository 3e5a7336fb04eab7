package scheduler

import (
	"github.com/retryd/retryd/pkg/contract"
	"github.com/retryd/retryd/stores/retrystore"
)

// The rebuild folds the scheduler's own facts (scheduled, rescheduled,
// exhausted, due) back into rows, next to the owners' facts the policy
// stage applies. Decisions are read, never re-made: the jitter drawn and
// the policy version in force are in the events.
//
// The due loop flushes the outbox before it publishes, so a decision
// normally precedes its due in the stream; these functions also accept a
// due that overtook its decision.

// replayScheduled applies a scheduled or rescheduled fact.
func replayScheduled(row *retrystore.Retry, f fact) change {
	sd := f.ev.Scheduled
	manual := sd.Decision.DecidedBy == contract.DecidedByManual
	var r retrystore.Retry
	switch {
	case row == nil:
		// The failure aged out of the stream; the decision is enough.
		r = retrystore.Retry{Kind: f.ev.Kind, ItemID: f.ev.ID, RetryEnabled: true, JobType: sd.JobType, Source: sd.Source}
		applyScheduleDecision(&r, sd)
	case manual && sd.Attempt > row.Attempt,
		!manual && awaitingDecision(row) && sd.Attempt == row.Attempt+1:
		r = *row
		applyScheduleDecision(&r, sd)
	case row.State == retrystore.StateDue && sd.Attempt == row.Attempt:
		// Its due came first: take the decision's figures, keep the state.
		r = *row
		state, next, dueAt, emissions := r.State, r.NextAttemptAt, r.DueAt, r.DueEmissions
		applyScheduleDecision(&r, sd)
		r.State, r.NextAttemptAt, r.DueAt, r.DueEmissions = state, next, dueAt, emissions
	default:
		return staleChange()
	}
	return change{row: &r, history: []retrystore.HistoryEntry{scheduledEntry(&r, f.ev.Event, sd, f.msgID, f.at)}, outcome: f.ev.Event}
}

// replayLateDecision applies a scheduled fact that reached the stream
// after the row had moved past it: its due overtook it (the due loop's
// flush of the outbox skips rows the relay is publishing), and the
// attempt's outcome may have followed before it. The live scheduler
// applied the decision before any of them, so the row takes the
// decision's figures and keeps what the later facts set. The rebuilder
// calls it only for the attempt an overtaking due moved the row to, whose
// decision it has not read yet: anything else is stale.
func replayLateDecision(row *retrystore.Retry, f fact) change {
	sd := f.ev.Scheduled
	if row == nil || sd.Attempt != row.Attempt || sd.Decision.DecidedBy == contract.DecidedByManual {
		return staleChange()
	}
	r := *row
	switch {
	case row.State == retrystore.StateSucceeded || row.State == retrystore.StateCancelled:
		// Due, then closed: as live, the decision, then its due, then the
		// outcome.
		applyScheduleDecision(&r, sd)
		r.State, r.NextAttemptAt, r.DueAt, r.DueEmissions = row.State, row.NextAttemptAt, row.DueAt, row.DueEmissions
		r.ExhaustedReason, r.ResolvedAt = row.ExhaustedReason, row.ResolvedAt
	case awaitingDecision(row):
		// The attempt failed or was held again: the row awaits the
		// decision of that. Live, the failure (or hold) was recorded on
		// the decision's figures; it set the rest (awaitDecision,
		// recordFailure, recordHold).
		r.MaxRetries = sd.Decision.MaxRetries
		r.PolicyName, r.PolicyVersion = sd.Decision.Policy, sd.Decision.PolicyVersion
		r.BudgetBase = max(sd.Attempt-1-sd.Decision.RetryCount, 0)
		r.RetryCount = max(r.Attempt-1-r.BudgetBase, 0)
		if r.HoldReason != "" {
			// Held: a hold keeps the decision's class and max_hold, where
			// a failure sets its own class and clears the hold.
			var scratch retrystore.Retry
			holdView(&scratch, &sd.Decision, sd.NextAttemptAt)
			r.MaxHoldMS = scratch.MaxHoldMS
			if sd.Decision.ErrorClass != "" {
				r.LastErrorClass = sd.Decision.ErrorClass
			}
		}
	default:
		return staleChange()
	}
	return change{row: &r, history: []retrystore.HistoryEntry{scheduledEntry(&r, f.ev.Event, sd, f.msgID, f.at)}, outcome: f.ev.Event}
}

// replayExhausted applies an exhausted fact to the row awaiting it.
func replayExhausted(row *retrystore.Retry, f fact) change {
	ed := f.ev.Exhausted
	var r retrystore.Retry
	switch {
	case row == nil:
		r = retrystore.Retry{Kind: f.ev.Kind, ItemID: f.ev.ID, Attempt: ed.Attempt, RetryEnabled: true, JobType: ed.JobType, Source: ed.Source}
	case awaitingDecision(row) && row.Attempt == ed.Attempt:
		r = *row
	default:
		return staleChange()
	}
	applyExhaustDecision(&r, ed, f.at)
	return change{row: &r, history: []retrystore.HistoryEntry{exhaustedEntry(&r, ed, f.msgID, f.at)}, outcome: contract.Exhausted}
}

// replayDue applies a due fact: the first emission of an attempt, a
// re-emission, or a due that overtook its decision (a higher attempt).
func replayDue(row *retrystore.Retry, f fact) change {
	dd := f.ev.Due
	var r retrystore.Retry
	switch {
	case row == nil || dd.Attempt > row.Attempt:
		r = rowOf(row, f)
		next := dd.NextAttemptAt
		r.Attempt, r.NextAttemptAt, r.DueEmissions = dd.Attempt, &next, 0
		r.JobType, r.Source = dd.JobType, dd.Source
		// The failure recorded them as sent; the due carries a re-encoded
		// copy, needed only when the failure aged out of the stream.
		if len(r.Payload) == 0 {
			r.Payload = dd.Payload
		}
		if len(r.Checkpoint) == 0 {
			r.Checkpoint = dd.Checkpoint
		}
		if r.Metadata == nil {
			r.Metadata = dd.Metadata
		}
		r.ExhaustedReason, r.ResolvedAt = "", nil
	case dd.Attempt == row.Attempt && (row.State == retrystore.StateDue ||
		(row.State == retrystore.StateScheduled && row.NextAttemptAt != nil)):
		r = *row
	default:
		return staleChange()
	}
	at := f.at
	r.State = retrystore.StateDue
	r.DueAt = &at
	r.DueEmissions++
	return change{row: &r, history: []retrystore.HistoryEntry{dueEntry(&r, f.msgID, f.at)}, outcome: contract.Due}
}
