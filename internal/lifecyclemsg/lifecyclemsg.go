// Package lifecyclemsg reads the messages the owner services (ingress,
// triggers) take from RETRIES about their own items: the lifecycle event,
// checked to be about the owner's kind, and the id the owner's inbox
// claims a message by (this one, InboxID, for any message with a contract
// envelope, the runs' too), so that a fact published twice is applied
// once.
package lifecyclemsg

import (
	"fmt"
	"slices"

	"github.com/nats-io/nats.go/jetstream"

	"github.com/retryd/retryd/pkg/contract"
)

// Decode strictly decodes msg (contract.DecodeLifecycle) and checks that
// it is about an item of kind and, when events are given, that it is one
// of them. A message that is not is contract.ErrInvalid naming the
// subject: it can never be applied.
func Decode(msg jetstream.Msg, kind string, events ...contract.Lifecycle) (contract.LifecycleEvent, error) {
	ev, err := contract.DecodeLifecycle(msg.Subject(), msg.Data())
	if err != nil {
		return contract.LifecycleEvent{}, err
	}
	if ev.Kind != kind || (len(events) > 0 && !slices.Contains(events, ev.Event)) {
		what := "a lifecycle event"
		if len(events) > 0 {
			what = fmt.Sprintf("a lifecycle event %v", events)
		}
		return contract.LifecycleEvent{}, &contract.FieldError{Field: "subject",
			Reason: fmt.Sprintf("%q is not %s of kind %s", msg.Subject(), what, kind), Err: contract.ErrInvalid}
	}
	return ev, nil
}

// InboxID is the id an inbox claims a message with envelope env by: its
// Nats-Msg-Id, which every publish of one fact carries alike, or else the
// envelope's id.
func InboxID(msg jetstream.Msg, env contract.Envelope) string {
	if id := msg.Headers().Get(contract.HeaderMsgID); id != "" {
		return id
	}
	return env.ID
}
