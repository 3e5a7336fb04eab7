package triggers

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"time"

	"cel.dev/cel-go/interpreter"
	"github.com/jackc/pgx/v5"
	"github.com/nats-io/nats.go"

	"github.com/retryd/retryd/pkg/contract"
	"github.com/retryd/retryd/services/triggers/internal/triggerstore"
)

// Reasons recorded in status_reason and in the metrics' reason labels.
// A throttled or concurrency-limited delivery is held (contract.HeldData,
// reason throttle or concurrency), not failed.
const (
	ReasonThrottled         = "trigger_throttled"
	ReasonMaxConcurrency    = "max_concurrency"
	ReasonPredicateFalse    = "predicate_false"
	ReasonPredicateError    = "predicate_error"
	ReasonThrottleKeyError  = "throttle_key_error"
	ReasonDefinitionError   = "definition_error"
	ReasonTriggerDeleted    = "trigger_deleted"
	ReasonTriggerDisabled   = "trigger_disabled"
	ReasonEventMissing      = "event_missing"
	ReasonDeliveryMissing   = "delivery_missing"
	cancelledBy             = "triggers"
	maxEmbeddedEnvelopeSize = contract.MaxDataBytes - 64
)

// offer is one event as the delivery paths see it.
type offer struct {
	env contract.Envelope
	act activation
	// raw is the envelope's JSON, embedded in run requests and retry
	// payloads when it fits (nil when it does not).
	raw json.RawMessage
	// full is the envelope's JSON whatever its size, kept in
	// trigger_events while a delivery of the event is held.
	full json.RawMessage
}

func newOffer(env contract.Envelope) (offer, error) {
	act, err := newActivation(env)
	if err != nil {
		return offer{}, invalidField("data", err.Error())
	}
	raw, err := env.Marshal()
	if err != nil {
		return offer{}, invalidField("data", err.Error())
	}
	full := raw
	if len(raw) > maxEmbeddedEnvelopeSize {
		raw = nil
	}
	return offer{env: env, act: act, raw: raw, full: full}, nil
}

// retryPayload is HeldData.Payload of a held delivery: the scheduler
// keeps it and brings it back on the due event, so a retry has the event
// without reading the EVENTS stream.
type retryPayload struct {
	Event json.RawMessage `json:"event,omitempty"`
}

// decision is what offering an event to a trigger once comes to.
type decision struct {
	status triggerstore.Status
	reason string
	key    string
	// retryAfter is when a throttle slot frees (zero for other outcomes).
	retryAfter time.Time
	meta       map[string]any
	// releaseWaiting: a slot is free but older deliveries wait for one;
	// this delivery queues and the oldest waiting one is released.
	releaseWaiting bool
	// waitUntil is set when a held delivery came back at its slot and the
	// window is still full for a moment (launches ahead of it ran late):
	// it keeps its place and looks again then, without a new hold.
	waitUntil time.Time
	// launchAt is the database clock read after the in-flight count that
	// allowed a launch under max concurrency: a run that finished between
	// the decision's first clock read and the count must not appear to
	// overlap the one it made room for.
	launchAt time.Time
}

// programsFor returns the compiled programs of a trigger version, from the
// cache or compiled now.
func (s *Service) programsFor(t triggerstore.Trigger) (compiled, error) {
	k := programKey{triggerID: t.ID, version: t.Version}
	if p, ok := s.programs.get(k); ok {
		return p, nil
	}
	var p compiled
	var err error
	if t.Predicate != "" {
		if p.predicate, err = s.exprs.compilePredicate(t.Predicate); err != nil {
			return compiled{}, err
		}
	}
	if t.ThrottleLimit > 0 && t.ThrottleKey != "" {
		if p.key, err = s.exprs.compileKey(t.ThrottleKey); err != nil {
			return compiled{}, err
		}
	}
	s.programs.put(k, p)
	return p, nil
}

// decide evaluates the predicate and the limits of a locked trigger for
// one delivery at the database time now. The throttle counts launches of
// other deliveries only: the delivery's own earlier held record never
// counts against it. A fresh delivery (its first offer) queues behind
// deliveries already waiting for a concurrency slot.
func (s *Service) decide(ctx context.Context, tx pgx.Tx, t triggerstore.Trigger, o offer, deliveryID string, now time.Time, fresh bool) (decision, error) {
	progs, err := s.programsFor(t)
	if err != nil {
		s.log.Error().Err(err).Str("trigger_id", t.ID).Int("version", t.Version).Msg("stored trigger definition does not compile")
		return decision{status: triggerstore.StatusFiltered, reason: ReasonDefinitionError}, nil
	}
	if progs.predicate != nil {
		ok, err := evalBool(ctx, progs.predicate, o.act)
		if err != nil {
			s.evalFailed(err, t, o, "predicate failed")
			return decision{status: triggerstore.StatusFiltered, reason: ReasonPredicateError}, nil
		}
		if !ok {
			return decision{status: triggerstore.StatusFiltered, reason: ReasonPredicateFalse}, nil
		}
	}
	var key string
	if t.ThrottleLimit > 0 {
		if progs.key != nil {
			if key, err = evalKey(ctx, progs.key, o.act); err != nil {
				s.evalFailed(err, t, o, "throttle key failed")
				return decision{status: triggerstore.StatusFiltered, reason: ReasonThrottleKeyError}, nil
			}
		}
		if dec, held, err := throttle(ctx, tx, t, key, deliveryID, now, fresh); err != nil || held {
			return dec, err
		}
	}
	if t.MaxConcurrency > 0 {
		n, err := triggerstore.CountInFlight(ctx, tx, t.ID)
		if err != nil {
			return decision{}, err
		}
		queue := false
		if fresh && n < t.MaxConcurrency {
			if queue, err = triggerstore.WaitingForSlot(ctx, tx, t.ID); err != nil {
				return decision{}, err
			}
		}
		if n >= t.MaxConcurrency || queue {
			return decision{status: triggerstore.StatusConcurrencyLimited, reason: ReasonMaxConcurrency, key: key, releaseWaiting: queue,
				meta: map[string]any{
					"reason": ReasonMaxConcurrency, "max_concurrency": t.MaxConcurrency, "in_flight": n, "trigger_version": t.Version,
				}}, nil
		}
	}
	launch := decision{status: triggerstore.StatusLaunched, key: key}
	if t.MaxConcurrency > 0 {
		at, err := triggerstore.Now(ctx, tx)
		if err != nil {
			return decision{}, err
		}
		launch.launchAt = at
	}
	return launch, nil
}

// evalFailed logs an expression that failed on an event. Not the error's
// text, in which CEL quotes the event's values, unless a limit stopped the
// evaluation: that message names only sizes and limits, and an operator
// wants to see it, because such a trigger filters every large event alike.
func (s *Service) evalFailed(err error, t triggerstore.Trigger, o offer, msg string) {
	ev := s.log.Debug()
	var stopped interpreter.EvalCancelledError
	if errors.As(err, &stopped) && stopped.Cause != interpreter.ContextCancelled {
		ev = s.log.Warn().Str("limit", stopped.Message)
	}
	ev.Str("trigger_id", t.ID).Int("version", t.Version).Str("event_id", o.env.ID).Msg(msg)
}

// throttle applies a trigger's throttle to one delivery: held reports
// whether dec (a throttle hold, or a wait in place) is the decision. A full
// window holds the delivery; so does a line of held deliveries for a fresh
// one, which would otherwise take the room a held one's slot was given
// for. Each held delivery gets its own slot, in arrival order, so the
// window's edge wakes one, not all.
func throttle(ctx context.Context, tx pgx.Tx, t triggerstore.Trigger, key, deliveryID string, now time.Time, fresh bool) (dec decision, held bool, err error) {
	at, full, err := triggerstore.NthRecentLaunch(ctx, tx, t.ID, key, now.Add(-t.ThrottleWindow), t.ThrottleLimit, deliveryID)
	if err != nil {
		return decision{}, false, err
	}
	if !fresh {
		roomAt := now
		if full {
			roomAt = at.Add(t.ThrottleWindow)
		}
		until, wait, err := throttleTurn(ctx, tx, t, key, deliveryID, roomAt, now)
		if err != nil || wait {
			return decision{waitUntil: until}, wait, err
		}
		if !full {
			return decision{}, false, nil // its turn, and room: no need to read the line
		}
	}
	slot, waiting, err := triggerstore.ThrottleSlot(ctx, tx, t.ID, key, now, t.ThrottleWindow, t.ThrottleLimit, deliveryID)
	if err != nil || !(full || waiting) {
		return decision{}, false, err
	}
	return decision{status: triggerstore.StatusThrottled, reason: ReasonThrottled, key: key, retryAfter: slot, meta: map[string]any{
		"reason": ReasonThrottled, "limit": t.ThrottleLimit, "window_ms": t.ThrottleWindow.Milliseconds(),
		"window_reset": slot.UTC().Format(time.RFC3339Nano), "slot": slot.UTC().Format(time.RFC3339Nano), "trigger_version": t.Version,
	}}, true, nil
}

// throttleTurnGap spaces the looks of holders waiting for room, by their
// place in line: more than the jitter of a redelivery's delay.
const throttleTurnGap = 3 * time.Millisecond

// throttleTurnLate is how long past its slot a held delivery is waited for
// by the ones behind it: long enough to cover one waiting in place for
// room. One whose due is later than that (lost with a killed process, or
// slow) no longer holds the line up.
const throttleTurnLate = time.Second

// throttleBehind is the least a holder waits behind holders ahead of it
// when the window has room: their redeliveries take a few milliseconds,
// and a shorter wait would only spin on the trigger's lock.
const throttleBehind = 25 * time.Millisecond

// maxThrottleWait bounds how long a held delivery waits in place for room
// at its slot; past it, it is held again with a new slot.
const maxThrottleWait = 5 * time.Second

// throttleTurn decides whether held delivery id, back at its slot, waits
// in place: for the room that frees at roomAt (now when the window has
// room), since the launches its slot counted on ran a little after their
// own slots; and behind the holders ahead of it whose slots came less than
// throttleTurnLate ago, which look first, throttleTurnGap apart, so the
// line keeps its order.
func throttleTurn(ctx context.Context, tx pgx.Tx, t triggerstore.Trigger, key, id string, roomAt, now time.Time) (time.Time, bool, error) {
	if roomAt.Sub(now) > maxThrottleWait {
		return time.Time{}, false, nil
	}
	ahead, err := triggerstore.ThrottleHoldersAhead(ctx, tx, t.ID, key, id, now.Add(-throttleTurnLate), now)
	if err != nil {
		return time.Time{}, false, err
	}
	if !roomAt.After(now) {
		if ahead == 0 {
			return time.Time{}, false, nil // its turn, and room: decide now
		}
		roomAt = now.Add(throttleBehind)
	}
	return roomAt.Add(time.Duration(ahead) * throttleTurnGap), true, nil
}

// settle applies a decision for attempt (1 = the event's first offer) to
// d and returns what must be written with it: the run to insert (launch
// only) and the messages for the outbox.
func settle(d *triggerstore.Delivery, t triggerstore.Trigger, o offer, dec decision, attempt int, now time.Time) (*triggerstore.Run, []*nats.Msg, error) {
	d.TriggerVersion, d.ThrottleKey = t.Version, dec.key
	d.Status, d.StatusReason = dec.status, dec.reason
	d.NextAttemptAt = nil
	retry := attempt > 1
	switch dec.status {
	case triggerstore.StatusLaunched:
		if !dec.launchAt.IsZero() {
			now = dec.launchAt
		}
		d.RunID, d.LaunchedAt = RunID(d.ID), &now
		run := &triggerstore.Run{ID: d.RunID, Workflow: t.Workflow, DeliveryID: d.ID, TriggerID: t.ID, EventID: d.EventID, RequestedAt: now}
		if t.RunTimeout > 0 {
			// Without its own timeout the run gets the service's, in write.
			lease := now.Add(t.RunTimeout)
			run.LeaseExpiresAt = &lease
		}
		req, err := contract.NewRunMsg(EventSource, contract.RunRequested, contract.RunRequestedData{
			RunID: run.ID, Workflow: t.Workflow, TriggerID: t.ID, TriggerVersion: t.Version,
			DeliveryID: d.ID, EventID: d.EventID, Event: o.raw,
		}, now)
		if err != nil {
			return nil, nil, err
		}
		msgs := []*nats.Msg{req}
		d.RetryState = triggerstore.RetryNone
		if retry {
			d.RetryState, d.RetryAttempts = triggerstore.RetryCompleted, attempt-1
			d.RetryMetadata = resolvedMeta(d.RetryMetadata, attempt, string(dec.status))
			ok, err := contract.NewLifecycleMsg(EventSource, contract.Succeeded, contract.SucceededData{
				Kind: contract.KindEventTrigger, ID: d.ID, Attempt: attempt,
				Metadata: map[string]string{"trigger_id": t.ID, "run_id": run.ID},
			}, now)
			if err != nil {
				return nil, nil, err
			}
			msgs = append(msgs, ok)
		}
		return run, msgs, nil
	case triggerstore.StatusThrottled, triggerstore.StatusConcurrencyLimited:
		d.RetryState, d.RetryAttempts = triggerstore.RetryScheduled, attempt
		d.RetryMetadata = dec.meta
		d.RetryMetadata["attempt"] = attempt
		hd := contract.HeldData{
			Kind: contract.KindEventTrigger, ID: d.ID, Attempt: attempt,
			Reason: contract.HoldConcurrency, HoldKey: t.ID, Source: d.Source,
			Detail:   fmt.Sprintf("max concurrency reached: %d runs in flight", t.MaxConcurrency),
			Metadata: map[string]string{"trigger_id": t.ID, "event_id": d.EventID, "workflow": t.Workflow},
		}
		if dec.status == triggerstore.StatusThrottled {
			d.NextAttemptAt = &dec.retryAfter
			until := dec.retryAfter.UTC()
			hd.Reason, hd.Until = contract.HoldThrottle, &until
			hd.Detail = fmt.Sprintf("trigger throttled: %d launches per %s; its slot in line at %s", t.ThrottleLimit, t.ThrottleWindow,
				until.Format(time.RFC3339Nano))
		}
		if o.raw != nil {
			p, err := json.Marshal(retryPayload{Event: o.raw})
			if err != nil {
				return nil, nil, fmt.Errorf("marshal retry payload: %w", err)
			}
			hd.Payload = p
		}
		msg, err := contract.NewLifecycleMsg(EventSource, contract.Held, hd, now)
		if err != nil {
			return nil, nil, err
		}
		if dec.releaseWaiting {
			// A slot is free: the delivery that waited longest takes it.
			rel, err := contract.NewLifecycleMsg(EventSource, contract.Released, contract.ReleasedData{
				Kind: contract.KindEventTrigger, HoldKey: t.ID, Reason: contract.ReleaseSlotFreed, By: cancelledBy,
				// Just before this delivery's own hold, which must not
				// count as overtaken by the release.
				ReleasedAt: now.Add(-time.Microsecond).UTC(), HoldReason: contract.HoldConcurrency, Count: 1,
				ReleaseID: "queued-" + d.ID,
			}, now)
			if err != nil {
				return nil, nil, err
			}
			return nil, []*nats.Msg{msg, rel}, nil
		}
		return nil, []*nats.Msg{msg}, nil
	default:
		if !retry {
			d.RetryState = triggerstore.RetryNone
			return nil, nil, nil
		}
		msgs, err := cancelRetry(d, dec.status, dec.reason, attempt, now)
		return nil, msgs, err
	}
}

// cancelRetry ends a held delivery's retries without a launch (filtered on
// a retry, trigger deleted or disabled, event gone) and returns the
// cancelled event that tells the scheduler.
func cancelRetry(d *triggerstore.Delivery, status triggerstore.Status, reason string, attempt int, now time.Time) ([]*nats.Msg, error) {
	d.Status, d.StatusReason = status, reason
	d.RetryState, d.RetryAttempts, d.NextAttemptAt = triggerstore.RetryCancelled, attempt, nil
	d.RetryMetadata = resolvedMeta(d.RetryMetadata, attempt, reason)
	msg, err := contract.NewLifecycleMsg(EventSource, contract.Cancelled, contract.CancelledData{
		Kind: contract.KindEventTrigger, ID: d.ID, Attempt: attempt, By: cancelledBy, Reason: reason,
	}, now)
	if err != nil {
		return nil, err
	}
	return []*nats.Msg{msg}, nil
}

func resolvedMeta(prev map[string]any, attempt int, resolution string) map[string]any {
	out := make(map[string]any, len(prev)+2)
	for k, v := range prev {
		out[k] = v
	}
	out["resolved_attempt"] = attempt
	out["resolution"] = resolution
	return out
}
