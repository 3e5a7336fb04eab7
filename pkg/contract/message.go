package contract

import (
	"encoding/json"
	"fmt"
	"strconv"
	"time"

	"github.com/nats-io/nats.go"
)

// item is implemented by every lifecycle data type.
type item interface {
	Validate() error
	itemKey() (kind, id string, attempt int)
}

func (d FailedData) itemKey() (string, string, int)    { return d.Kind, d.ID, d.Attempt }
func (d SucceededData) itemKey() (string, string, int) { return d.Kind, d.ID, d.Attempt }
func (d ScheduledData) itemKey() (string, string, int) { return d.Kind, d.ID, d.Attempt }
func (d DueData) itemKey() (string, string, int)       { return d.Kind, d.ID, d.Attempt }
func (d ExhaustedData) itemKey() (string, string, int) { return d.Kind, d.ID, d.Attempt }
func (d CancelledData) itemKey() (string, string, int) { return d.Kind, d.ID, d.Attempt }

// NewLifecycleMsg builds the NATS message for a lifecycle event: subject
// retry.<kind>.<event>.<id>, the deterministic Nats-Msg-Id, the Retryd-*
// headers and a CloudEvents envelope whose id is the Nats-Msg-Id. source
// names the publisher, e.g. "retryd/scheduler".
func NewLifecycleMsg(source string, ev Lifecycle, data item, now time.Time) (*nats.Msg, error) {
	if !ev.Valid() {
		return nil, fieldErr("event", fmt.Sprintf("%q is not a lifecycle event", ev))
	}
	if err := checkDataType(ev, data); err != nil {
		return nil, err
	}
	if err := data.Validate(); err != nil {
		return nil, fmt.Errorf("build %s event: %w", ev, err)
	}
	kind, id, attempt := data.itemKey()
	raw, err := json.Marshal(data)
	if err != nil {
		return nil, fmt.Errorf("marshal %s data: %w", ev, err)
	}
	msgID := LifecycleMsgID(kind, ev, id, attempt)
	if rd, ok := releasedData(data); ok {
		msgID = releasedMsgID(rd)
	}
	env := Envelope{
		SpecVersion:     SpecVersion,
		ID:              msgID,
		Source:          source,
		Type:            ev.CloudEventType(),
		Time:            now.UTC(),
		Subject:         kind + "/" + id,
		DataContentType: ContentTypeJSON,
	}
	body, err := env.marshalWithData(raw)
	if err != nil {
		return nil, err
	}
	msg := nats.NewMsg(RetrySubject(kind, ev, id))
	msg.Data = body
	msg.Header.Set(HeaderMsgID, msgID)
	msg.Header.Set(HeaderContentType, ContentTypeJSON)
	msg.Header.Set(HeaderKind, kind)
	msg.Header.Set(HeaderItemID, id)
	msg.Header.Set(HeaderAttempt, strconv.Itoa(attempt))
	msg.Header.Set(HeaderEvent, string(ev))
	if err := checkMsgSize(msg); err != nil {
		return nil, fmt.Errorf("build %s event: %w", ev, err)
	}
	return msg, nil
}

// releasedData returns data as a release, whether passed by value or by
// pointer.
func releasedData(data item) (ReleasedData, bool) {
	switch d := data.(type) {
	case ReleasedData:
		return d, true
	case *ReleasedData:
		return *d, true
	}
	return ReleasedData{}, false
}

func checkDataType(ev Lifecycle, data item) error {
	ok := false
	switch data.(type) {
	case FailedData, *FailedData:
		ok = ev == Failed
	case SucceededData, *SucceededData:
		ok = ev == Succeeded
	case ScheduledData, *ScheduledData:
		ok = ev == Scheduled || ev == Rescheduled
	case DueData, *DueData:
		ok = ev == Due
	case ExhaustedData, *ExhaustedData:
		ok = ev == Exhausted
	case CancelledData, *CancelledData:
		ok = ev == Cancelled
	case HeldData, *HeldData:
		ok = ev == Held
	case ReleasedData, *ReleasedData:
		ok = ev == Released
	}
	if !ok {
		return fieldErr("data", fmt.Sprintf("%T does not go with lifecycle event %q", data, ev))
	}
	return nil
}

// LifecycleEvent is a decoded lifecycle message: the envelope, the parsed
// subject, and exactly one of the data fields, the one for Event.
type LifecycleEvent struct {
	Envelope  Envelope
	Event     Lifecycle
	Kind      string
	ID        string
	Failed    *FailedData
	Succeeded *SucceededData
	Scheduled *ScheduledData
	Due       *DueData
	Exhausted *ExhaustedData
	Cancelled *CancelledData
	Held      *HeldData
	Released  *ReleasedData
}

// Attempt returns the attempt number carried by the event's data.
func (e LifecycleEvent) Attempt() int {
	switch {
	case e.Failed != nil:
		return e.Failed.Attempt
	case e.Succeeded != nil:
		return e.Succeeded.Attempt
	case e.Scheduled != nil:
		return e.Scheduled.Attempt
	case e.Due != nil:
		return e.Due.Attempt
	case e.Exhausted != nil:
		return e.Exhausted.Attempt
	case e.Cancelled != nil:
		return e.Cancelled.Attempt
	case e.Held != nil:
		return e.Held.Attempt
	}
	return 0
}

// DecodeLifecycle strictly decodes a message from RETRIES. The subject, the
// envelope type and the data must agree on the event, kind and id.
func DecodeLifecycle(subject string, body []byte) (LifecycleEvent, error) {
	parts, err := ParseRetrySubject(subject)
	if err != nil {
		return LifecycleEvent{}, err
	}
	env, err := DecodeEnvelope(body)
	if err != nil {
		return LifecycleEvent{}, err
	}
	if env.Type != parts.Event.CloudEventType() {
		return LifecycleEvent{}, fieldErr("type", fmt.Sprintf("%q does not match subject event %q", env.Type, parts.Event))
	}
	if len(env.Data) == 0 {
		return LifecycleEvent{}, fieldErr("data", "is required")
	}
	out := LifecycleEvent{Envelope: env, Event: parts.Event, Kind: parts.Kind, ID: parts.ID}
	var data item
	switch parts.Event {
	case Failed:
		data = fill(&out.Failed)
	case Succeeded:
		data = fill(&out.Succeeded)
	case Scheduled, Rescheduled:
		data = fill(&out.Scheduled)
	case Due:
		data = fill(&out.Due)
	case Exhausted:
		data = fill(&out.Exhausted)
	case Cancelled:
		data = fill(&out.Cancelled)
	case Held:
		data = fill(&out.Held)
	case Released:
		data = fill(&out.Released)
	}
	if err := decodeShaped("data", env.Data, data); err != nil {
		return LifecycleEvent{}, err
	}
	if err := data.Validate(); err != nil {
		return LifecycleEvent{}, err
	}
	kind, id, _ := data.itemKey()
	if kind != parts.Kind || id != parts.ID {
		return LifecycleEvent{}, fieldErr("data", fmt.Sprintf("kind/id %q/%q does not match subject %q/%q", kind, id, parts.Kind, parts.ID))
	}
	return out, nil
}

// fill points *field at a new zero value and returns it, for the decoder
// to fill in: the event's one data field and what is decoded are the same.
func fill[T any](field **T) *T {
	*field = new(T)
	return *field
}
