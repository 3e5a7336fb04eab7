package ingress

import (
	"time"

	"github.com/nats-io/nats.go"

	"github.com/retryd/retryd/pkg/contract"
	"github.com/retryd/retryd/pkg/errclass"
	"github.com/retryd/retryd/services/ingress/internal/ingressstore"
)

// eventMsg is the admitted event on events.<source>.<type>; its
// Nats-Msg-Id is the event id, so an event is admitted once even if the
// relay publishes it twice.
func eventMsg(id, source, typ string, envelope []byte) *nats.Msg {
	msg := nats.NewMsg(contract.EventSubject(source, typ))
	msg.Data = envelope
	msg.Header.Set(contract.HeaderMsgID, id)
	msg.Header.Set(contract.HeaderContentType, contract.ContentTypeJSON)
	return msg
}

// deferral describes one rejected attempt of an event.
type deferral struct {
	id, source, typ string
	attempt         int
	reason, detail  string
	class           errclass.Class
	retryAt         time.Time // zero: no hint
}

func (s *Service) newDeferral(ev ingressstore.Event, attempt int, v ingressstore.Verdict) deferral {
	class := errclass.RateLimit
	if v.Reason == ingressstore.ReasonSourcePaused {
		class = s.cfg.PausedClass
	}
	return deferral{id: ev.ID, source: ev.Source, typ: ev.Type, attempt: attempt,
		reason: v.Reason, detail: v.Detail, class: class, retryAt: v.RetryAt}
}

func (d deferral) record() ingressstore.Deferral {
	return ingressstore.Deferral{EventID: d.id, Source: d.source, Attempt: d.attempt, Reason: d.reason,
		Detail: d.detail, Class: string(d.class), RetryAt: d.retryAt}
}

// heldMsg is retry.event.held.<eventId> for the deferral: the gate held
// the event back, no attempt failed, so the scheduler keeps its retry
// budget and releases it at retryAt (the end of the rate window or of the
// pause), or, for a pause without an end, when the source is resumed
// (hold key: the source).
func heldMsg(d deferral, now time.Time) (*nats.Msg, error) {
	data := contract.HeldData{
		Kind:     contract.KindEvent,
		ID:       d.id,
		Attempt:  d.attempt,
		Reason:   holdReason(d.reason),
		HoldKey:  d.source,
		Detail:   d.reason,
		Source:   d.source,
		Metadata: map[string]string{"type": d.typ},
	}
	if d.detail != "" {
		data.Detail += ": " + d.detail
	}
	if !d.retryAt.IsZero() {
		until := d.retryAt.UTC()
		data.Until = &until
	}
	return contract.NewLifecycleMsg(PublisherSource, contract.Held, data, now)
}

// holdReason maps a gate verdict's reason to the hold's.
func holdReason(reason string) string {
	if reason == ingressstore.ReasonSourcePaused {
		return contract.HoldPause
	}
	return contract.HoldThrottle
}

// releasedMsg is retry.event.released.<source>: the source was resumed,
// or its limit changed, at at (database clock), so every event it holds is
// due now, or at its slot of pace when the source has a rate limit.
// ownerAdmits says ingress's releaser admits them itself.
func releasedMsg(source, reason, by string, at time.Time, pace *contract.ReleasePace, ownerAdmits bool, now time.Time) (*nats.Msg, error) {
	return contract.NewLifecycleMsg(PublisherSource, contract.Released, contract.ReleasedData{
		Kind: contract.KindEvent, HoldKey: source, Reason: reason, By: by, ReleasedAt: at.UTC(), Pace: pace,
		OwnerAdmits: ownerAdmits,
	}, now)
}

func succeededMsg(id, source string, attempt int, now time.Time) (*nats.Msg, error) {
	return contract.NewLifecycleMsg(PublisherSource, contract.Succeeded, contract.SucceededData{
		Kind: contract.KindEvent, ID: id, Attempt: attempt, Metadata: map[string]string{"source": source},
	}, now)
}

func cancelledMsg(id string, attempt int, by, reason string, now time.Time) (*nats.Msg, error) {
	return contract.NewLifecycleMsg(PublisherSource, contract.Cancelled, contract.CancelledData{
		Kind: contract.KindEvent, ID: id, Attempt: attempt, By: by, Reason: reason,
	}, now)
}
