package scheduler

import (
	"encoding/json"
	"time"

	"github.com/nats-io/nats.go"

	"github.com/retryd/retryd/pkg/contract"
	"github.com/retryd/retryd/stores/retrystore"
)

// The state machine of a retry row. Each function takes the current row
// (nil when the item has none) and a lifecycle fact and returns the change
// to write. The policy stage and the rebuild share them, which is what
// makes a rebuilt projection equal the original.
//
//	failed(n)      row absent, or pending with attempt n -> decided: scheduled(n+1) or exhausted
//	held(n)        as failed(n), but decided as a hold: scheduled(n+1) with the same
//	               retry count (budget_base + 1), or exhausted hold_expired
//	released(key)  every hold under key -> due now, in hold order (set-based)
//	scheduled(m)   written with the decision
//	due(m)         scheduled -> due (again: due -> due, one more emission)
//	succeeded      pending -> succeeded
//	cancelled      pending or absent -> cancelled
//	manual retry   any row -> scheduled(attempt+1), now
//
// A fact that does not fit (an old attempt, a terminal row) is stale and
// changes nothing.

// source is the CloudEvents source of every event the scheduler publishes.
const source = "retryd/scheduler"

// fact is one lifecycle message as the state machine sees it.
type fact struct {
	ev    contract.LifecycleEvent
	msgID string
	// at is the envelope time, at the database's precision.
	at time.Time
}

func newFact(ev contract.LifecycleEvent, msgID string) fact {
	return fact{ev: ev, msgID: msgID, at: ev.Envelope.Time.Truncate(time.Microsecond)}
}

// change is what applying a fact writes.
type change struct {
	// row is saved when not nil.
	row     *retrystore.Retry
	history []retrystore.HistoryEntry
	// msgs go to the outbox.
	msgs []*nats.Msg
	// outcome names the lifecycle event the change produced, for metrics:
	// scheduled, rescheduled, exhausted, succeeded, cancelled or "".
	outcome contract.Lifecycle
	stale   bool
	// untracked: a fact about an item the scheduler has no row for and
	// does not need one (a first-attempt success).
	untracked bool
}

func staleChange() change { return change{stale: true} }

// pending reports whether r waits for a due emission or an outcome.
func pending(r *retrystore.Retry) bool { return r != nil && !r.State.Terminal() }

// awaitingDecision marks a row whose failure was recorded by a rebuild but
// whose decision was not read yet: scheduled without a time. The live
// policy stage never stores such a row.
func awaitingDecision(r *retrystore.Retry) bool {
	return r != nil && r.State == retrystore.StateScheduled && r.NextAttemptAt == nil
}

// acceptsFailure is the guard of a failed fact: the item is new, or pending
// and the failure is of the attempt the row expects. Anything else is a
// replay or a report of an attempt the scheduler moved past (cancelled,
// retried by hand).
func acceptsFailure(row *retrystore.Retry, attempt int) bool {
	return row == nil || (pending(row) && row.Attempt == attempt)
}

// keepOverrides copies a job's overrides and priority, as a failed or
// held event carries them, into the row: its due gives them back. A fact
// without a priority leaves the row's (an owner that does not send one).
func keepOverrides(r *retrystore.Retry, maxRetries *int, retryEnabled *bool, timeoutMS int64, priority contract.Priority) {
	if priority != "" {
		r.Priority = string(priority)
	}
	if maxRetries != nil {
		v := *maxRetries
		r.MaxRetriesOverride = &v
	}
	if retryEnabled != nil {
		r.RetryEnabled = *retryEnabled
	}
	if timeoutMS > 0 {
		r.TimeoutMS = &timeoutMS
	}
}

// rowOf is the row a fact about f's item changes: a copy of row, or a new
// one for an item the scheduler has no row of yet.
func rowOf(row *retrystore.Retry, f fact) retrystore.Retry {
	if row != nil {
		return *row
	}
	return retrystore.Retry{Kind: f.ev.Kind, ItemID: f.ev.ID, RetryEnabled: true}
}

// keepWork copies what a failed or held event carries so that the item
// can run again (its job type and source, the payload, checkpoint and
// metadata as the owner sent them) into the row; what the fact leaves out
// keeps the row's.
func keepWork(r *retrystore.Retry, jobType, source string, payload, checkpoint json.RawMessage, metadata map[string]string) {
	if jobType != "" {
		r.JobType = jobType
	}
	if source != "" {
		r.Source = source
	}
	if len(payload) > 0 {
		r.Payload = payload
	}
	if len(checkpoint) > 0 {
		r.Checkpoint = checkpoint
	}
	if metadata != nil {
		r.Metadata = metadata
	}
}

// awaitDecision leaves the row at attempt, scheduled without a time (what
// awaitingDecision reports): the decision on the failure or hold (reason)
// that asked for it sets one.
func awaitDecision(r *retrystore.Retry, attempt int, reason string) {
	r.State = retrystore.StateScheduled
	r.Attempt = attempt
	r.RetryCount = max(attempt-1-r.BudgetBase, 0)
	r.NextAttemptAt, r.DueAt, r.DueEmissions = nil, nil, 0
	r.LastReason = reason
	r.ExhaustedReason, r.ResolvedAt = "", nil
}

// recordFailure copies a failure into the row and returns the failed
// history entry. The row is left awaiting its decision.
func recordFailure(row *retrystore.Retry, f fact, class string) (retrystore.Retry, retrystore.HistoryEntry) {
	fd := f.ev.Failed
	r := rowOf(row, f)
	keepWork(&r, fd.JobType, fd.Source, fd.Payload, fd.Checkpoint, fd.Metadata)
	keepOverrides(&r, fd.MaxRetries, fd.RetryEnabled, fd.TimeoutMS, fd.Priority)
	awaitDecision(&r, fd.Attempt, fd.Reason)
	at := f.at
	r.LastErrorClass = class
	r.LastErrorMessage = fd.Error.Message
	r.LastErrorAt = &at
	// An attempt ran: whatever held the item before has lifted.
	r.HeldSince, r.HoldReason, r.HoldKey, r.HoldUntil, r.MaxHoldMS = nil, "", "", nil, nil

	h := entry(&r, fd.Attempt, contract.Failed, f.msgID, f.at)
	h.Executor = fd.Executor
	h.ErrorClass = class
	h.ErrorMessage = fd.Error.Message
	h.Detail = failedDetail(fd)
	return r, h
}

// failedDetail keeps what the decision used besides the class, so a
// rebuild can decide for a failure whose decision never reached the stream.
type failedDetailJSON struct {
	Reason       string               `json:"reason,omitempty"`
	RetryAfter   *contract.RetryAfter `json:"retry_after,omitempty"`
	NonRetryable bool                 `json:"non_retryable,omitempty"`
}

func failedDetail(fd *contract.FailedData) json.RawMessage {
	if fd.Reason == "" && fd.RetryAfter == nil && !fd.Error.NonRetryable {
		return nil
	}
	b, _ := json.Marshal(failedDetailJSON{Reason: fd.Reason, RetryAfter: fd.RetryAfter, NonRetryable: fd.Error.NonRetryable})
	return b
}

// entry starts a history entry for r.
func entry(r *retrystore.Retry, attempt int, ev contract.Lifecycle, msgID string, at time.Time) retrystore.HistoryEntry {
	return retrystore.HistoryEntry{
		Kind: r.Kind, ItemID: r.ItemID, Attempt: attempt, Event: string(ev),
		JobType: r.JobType, Source: r.Source, MsgID: msgID, At: at,
	}
}

// scheduledEntry is the history entry of a scheduled or rescheduled fact:
// the decision in full ("why did it retry?").
func scheduledEntry(r *retrystore.Retry, ev contract.Lifecycle, sd *contract.ScheduledData, msgID string, at time.Time) retrystore.HistoryEntry {
	h := entry(r, sd.Attempt, ev, msgID, at)
	next := sd.NextAttemptAt
	delay := sd.Decision.DelayMS
	h.NextAttemptAt = &next
	h.DelayMS = &delay
	h.DecidedBy = sd.Decision.DecidedBy
	h.PolicyName = sd.Decision.Policy
	h.PolicyVersion = sd.Decision.PolicyVersion
	h.ErrorClass = sd.Decision.ErrorClass
	h.Detail, _ = json.Marshal(sd.Decision)
	return h
}

func exhaustedEntry(r *retrystore.Retry, ed *contract.ExhaustedData, msgID string, at time.Time) retrystore.HistoryEntry {
	h := entry(r, ed.Attempt, contract.Exhausted, msgID, at)
	h.ErrorClass = ed.Error.Class
	h.PolicyName = ed.Policy
	h.PolicyVersion = ed.PolicyVersion
	h.Detail, _ = json.Marshal(map[string]any{"reason": ed.Reason, "retry_count": ed.RetryCount, "max_retries": ed.MaxRetries})
	return h
}

func dueEntry(r *retrystore.Retry, msgID string, at time.Time) retrystore.HistoryEntry {
	h := entry(r, r.Attempt, contract.Due, msgID, at)
	h.NextAttemptAt = r.NextAttemptAt
	h.Detail, _ = json.Marshal(map[string]int{"emission": r.DueEmissions})
	return h
}

// applyScheduleDecision moves a row awaiting its decision to scheduled.
func applyScheduleDecision(r *retrystore.Retry, sd *contract.ScheduledData) {
	next := sd.NextAttemptAt
	r.State = retrystore.StateScheduled
	r.Attempt = sd.Attempt
	r.RetryCount = sd.Decision.RetryCount
	r.MaxRetries = sd.Decision.MaxRetries
	r.PolicyName, r.PolicyVersion = sd.Decision.Policy, sd.Decision.PolicyVersion
	r.NextAttemptAt = &next
	r.DueAt, r.DueEmissions = nil, 0
	r.ExhaustedReason, r.ResolvedAt = "", nil
	// Attempts keep growing (due ids stay unique) while the budget counts
	// only failures: a backoff keeps budget_base, a hold raises it by one
	// (its attempt did not run), a manual retry may reset it.
	r.BudgetBase = max(sd.Attempt-1-sd.Decision.RetryCount, 0)
	if sd.Decision.DecidedBy != contract.DecidedByManual && sd.Decision.ErrorClass != "" {
		r.LastErrorClass = sd.Decision.ErrorClass
	}
	holdView(r, &sd.Decision, next)
}

// holdView keeps on the row what the views show of a hold
// (retrystore.Retry.CurrentHold): a hold decision's max_hold and, where
// the hold's end is known, that end, which is then its next attempt (the
// owner's until, a release, max_hold); a pause without an end, or a
// throttle or concurrency hold looked at again after a backoff delay,
// has none. Any other decision (a backoff, a manual retry) ends the hold.
func holdView(r *retrystore.Retry, d *contract.Decision, next time.Time) {
	if d.HoldReason == "" || d.MaxHoldMS <= 0 {
		r.HoldUntil, r.MaxHoldMS = nil, nil
		return
	}
	maxHold := d.MaxHoldMS
	r.MaxHoldMS = &maxHold
	known := d.DecidedBy == contract.DecidedByResume || d.DecidedBy == contract.DecidedByPauseUntil ||
		d.CappedBy == contract.CappedByMaxHold || (d.DecidedBy == contract.DecidedByHold && r.HoldUntil != nil)
	r.HoldUntil = nil
	if known {
		r.HoldUntil = &next
	}
}

// applyExhaustDecision moves a row awaiting its decision to exhausted.
func applyExhaustDecision(r *retrystore.Retry, ed *contract.ExhaustedData, at time.Time) {
	r.State = retrystore.StateExhausted
	r.ExhaustedReason = ed.Reason
	r.RetryCount = ed.RetryCount
	r.MaxRetries = ed.MaxRetries
	r.PolicyName, r.PolicyVersion = ed.Policy, ed.PolicyVersion
	r.NextAttemptAt = nil
	if ed.Error.Class != "" {
		r.LastErrorClass = ed.Error.Class
	}
	r.ResolvedAt = &at
}

// applySucceeded closes a pending row. A success of an item without a row
// (it never failed) needs no row.
func applySucceeded(row *retrystore.Retry, f fact) change {
	sd := f.ev.Succeeded
	if row == nil {
		return change{untracked: true}
	}
	if !pending(row) {
		return staleChange()
	}
	r := *row
	var history []retrystore.HistoryEntry
	if h, ok := lateDue(row, sd.Attempt, f.at); ok {
		r.DueEmissions, r.DueAt = 1, r.NextAttemptAt
		history = append(history, h)
	}
	at := f.at
	r.State = retrystore.StateSucceeded
	r.Attempt = max(r.Attempt, sd.Attempt)
	r.ResolvedAt = &at
	h := entry(&r, sd.Attempt, contract.Succeeded, f.msgID, f.at)
	h.Executor = sd.Executor
	if row.State == retrystore.StateScheduled && row.HeldSince != nil {
		// The owner admitted a held item before its hold's time: a
		// release let it (a resume, a limit change), which the scheduler
		// may not have written on the row yet (a release the owner admits
		// runs behind it, releaseparts.go). The close records it.
		h.DecidedBy = contract.DecidedByResume
		h.Detail = admittedDetail(row)
	}
	history = append(history, h)
	return change{row: &r, history: history, outcome: contract.Succeeded}
}

type admittedDetailJSON struct {
	DecidedBy  string    `json:"decided_by"`
	HoldKey    string    `json:"hold_key,omitempty"`
	HoldReason string    `json:"hold_reason,omitempty"`
	HeldSince  time.Time `json:"held_since"`
	Note       string    `json:"note"`
}

func admittedDetail(row *retrystore.Retry) json.RawMessage {
	b, _ := json.Marshal(admittedDetailJSON{DecidedBy: contract.DecidedByResume, HoldKey: row.HoldKey, HoldReason: row.HoldReason,
		HeldSince: *row.HeldSince, Note: "admitted by its owner before its hold's time, after a release of the hold"})
	return b
}

// lateDue is the history entry of the due of attempt when the owner
// answers attempt (succeeded, failed, held) while row r still waits for it
// with no due recorded, its time passed when the owner answered
// (answeredAt, the fact's time): the due loop published the due and died
// before its commit (the claim rolled back), and the owner's answer came
// before the re-send. An owner runs an attempt after the first only on its
// due, so the due is on the stream; the history records it, once, under
// its Nats-Msg-Id, at the time it was due. An answer from before that
// time (an owner that did not wait for its due) records none.
func lateDue(r *retrystore.Retry, attempt int, answeredAt time.Time) (retrystore.HistoryEntry, bool) {
	if r == nil || r.State != retrystore.StateScheduled || r.Attempt != attempt || attempt < 2 ||
		r.DueEmissions > 0 || r.NextAttemptAt == nil || answeredAt.Before(*r.NextAttemptAt) {
		return retrystore.HistoryEntry{}, false
	}
	h := entry(r, attempt, contract.Due, contract.DueMsgID(r.Kind, r.ItemID, attempt), *r.NextAttemptAt)
	h.NextAttemptAt = r.NextAttemptAt
	h.Detail, _ = json.Marshal(map[string]any{"emission": 1,
		"note": "recorded when the owner answered: the due's commit did not happen (the scheduler died after publishing it)"})
	return h, true
}

// applyCancelled closes a pending row, or creates a cancelled one for an
// item cancelled before it ever failed, so a later failure is not retried.
func applyCancelled(row *retrystore.Retry, f fact) change {
	cd := f.ev.Cancelled
	if row != nil && !pending(row) {
		return staleChange()
	}
	r := rowOf(row, f)
	at := f.at
	r.State = retrystore.StateCancelled
	r.Attempt = max(r.Attempt, cd.Attempt)
	r.ResolvedAt = &at
	h := entry(&r, cd.Attempt, contract.Cancelled, f.msgID, f.at)
	h.Detail, _ = json.Marshal(map[string]string{"by": cd.By, "reason": cd.Reason})
	return change{row: &r, history: []retrystore.HistoryEntry{h}, outcome: contract.Cancelled}
}
