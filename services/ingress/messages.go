package ingress

import (
	"time"

	"github.com/nats-io/nats.go"

	"github.com/retryd/retryd/pkg/contract"
	"github.com/retryd/retryd/pkg/errclass"
	"github.com/retryd/retryd/projections/ingressstore"
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

// failedMsg is retry.event.failed.<eventId> for the deferral: the reason
// makes the scheduler record decided_by=throttle when a hint is given, and
// an indefinite pause leaves the delay to the event policy's backoff.
func failedMsg(d deferral, now time.Time) (*nats.Msg, error) {
	msg := d.reason
	if d.detail != "" {
		msg += ": " + d.detail
	}
	data := contract.FailedData{
		Kind:     contract.KindEvent,
		ID:       d.id,
		Attempt:  d.attempt,
		Error:    contract.ErrorInfo{Class: string(d.class), Message: msg},
		Reason:   d.reason,
		Source:   d.source,
		Metadata: map[string]string{"type": d.typ},
	}
	if !d.retryAt.IsZero() {
		data.RetryAfter = contract.RetryAfterAt(d.retryAt)
	}
	return contract.NewLifecycleMsg(PublisherSource, contract.Failed, data, now)
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
