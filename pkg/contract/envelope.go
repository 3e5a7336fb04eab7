package contract

import (
	"encoding/json"
	"fmt"
	"time"
)

// SpecVersion is the CloudEvents version of every envelope.
const SpecVersion = "1.0"

// Envelope is a CloudEvents 1.0 event in JSON structured mode. Producer
// events on INGEST and EVENTS, lifecycle events on RETRIES, runs and jobs all
// travel in it.
type Envelope struct {
	SpecVersion     string          `json:"specversion"`
	ID              string          `json:"id"`
	Source          string          `json:"source"`
	Type            string          `json:"type"`
	Time            time.Time       `json:"time"`
	Subject         string          `json:"subject,omitempty"`
	DataContentType string          `json:"datacontenttype,omitempty"`
	DataSchema      string          `json:"dataschema,omitempty"`
	Data            json.RawMessage `json:"data,omitempty"`
	// Extensions are a producer event's extension attributes (strings,
	// booleans and 32-bit integers), kept and passed on to EVENTS as
	// members of the envelope. retryd's own messages have none.
	Extensions map[string]any `json:"-"`
}

// ProducerEvent is what a producer sends to POST /v1/events or to
// ingest.<source>: an envelope whose specversion, id and time may be left
// out (ingress fills them in).
type ProducerEvent struct {
	SpecVersion     string          `json:"specversion,omitempty"`
	ID              string          `json:"id,omitempty"`
	Source          string          `json:"source"`
	Type            string          `json:"type"`
	Time            *time.Time      `json:"time,omitempty"`
	Subject         string          `json:"subject,omitempty"`
	DataContentType string          `json:"datacontenttype,omitempty"`
	DataSchema      string          `json:"dataschema,omitempty"`
	Data            json.RawMessage `json:"data,omitempty"`
	// Extensions are the event's extension attributes (see Envelope).
	Extensions map[string]any `json:"-"`
}

// DecodeProducerEvent strictly decodes and validates a producer event in
// structured mode. Members that are not CloudEvents attributes are its
// extension attributes (Extensions), held to their rules; fields left
// out stay empty; call Envelope to complete it.
func DecodeProducerEvent(b []byte) (ProducerEvent, error) {
	if err := checkShape("event", b, MaxEnvelopeBytes); err != nil {
		return ProducerEvent{}, err
	}
	core, ext, err := splitExtensions(b)
	if err != nil {
		return ProducerEvent{}, err
	}
	var ev ProducerEvent
	if err := decodeShaped("event", core, &ev); err != nil {
		return ProducerEvent{}, err
	}
	ev.Extensions = ext
	return ev, ev.Validate()
}

// Key is the token that stands for the event's source (SourceKey).
func (ev ProducerEvent) Key() string { return SourceKey(ev.Source) }

// Validate checks every field of a producer event.
func (ev ProducerEvent) Validate() error {
	if ev.SpecVersion != "" && ev.SpecVersion != SpecVersion {
		return fieldErr("specversion", fmt.Sprintf("must be %q, got %q", SpecVersion, ev.SpecVersion))
	}
	if ev.ID != "" {
		if err := ValidateID("id", ev.ID); err != nil {
			return err
		}
	}
	// Envelope converts the time to UTC, which must still be a time the
	// envelope can carry.
	if ev.Time != nil && (ev.Time.IsZero() || !inYearRange(*ev.Time)) {
		return fieldErr("time", "must be between the years 0001 and 9999 in UTC, leave it out for now")
	}
	if err := ValidateSource("source", ev.Source); err != nil {
		return err
	}
	if err := ValidateType("type", ev.Type); err != nil {
		return err
	}
	if len(ev.Subject) > MaxIDLen {
		return fieldErr("subject", fmt.Sprintf("is longer than %d characters", MaxIDLen))
	}
	if ev.DataContentType != "" {
		if err := validateMediaType("datacontenttype", ev.DataContentType); err != nil {
			return err
		}
	}
	if ev.DataSchema != "" {
		if err := validateDataSchema("dataschema", ev.DataSchema); err != nil {
			return err
		}
	}
	return checkRaw("data", ev.Data)
}

// Envelope completes a producer event: id (when empty, from fallbackID),
// specversion and time (when empty, now).
func (ev ProducerEvent) Envelope(fallbackID string, now time.Time) Envelope {
	id := ev.ID
	if id == "" {
		id = fallbackID
	}
	t := now.UTC()
	if ev.Time != nil {
		t = ev.Time.UTC()
	}
	return Envelope{
		SpecVersion:     SpecVersion,
		ID:              id,
		Source:          ev.Source,
		Type:            ev.Type,
		Time:            t,
		Subject:         ev.Subject,
		DataContentType: ev.DataContentType,
		DataSchema:      ev.DataSchema,
		Data:            ev.Data,
		Extensions:      ev.Extensions,
	}
}

// DecodeEnvelope strictly decodes a complete envelope and validates its
// attributes. Lifecycle, run and job envelopes have a free-form source (such
// as "retryd/scheduler"); use ValidateEventEnvelope for producer events.
func DecodeEnvelope(b []byte) (Envelope, error) {
	var env Envelope
	if err := decodeStrict("envelope", b, MaxEnvelopeBytes, &env); err != nil {
		return Envelope{}, err
	}
	return env, env.validate()
}

func (env Envelope) validate() error {
	if env.SpecVersion != SpecVersion {
		return fieldErr("specversion", fmt.Sprintf("must be %q, got %q", SpecVersion, env.SpecVersion))
	}
	if env.ID == "" || len(env.ID) > 2*MaxIDLen+64 {
		return fieldErr("id", "is required and at most 320 characters")
	}
	if env.Source == "" || len(env.Source) > 256 {
		return fieldErr("source", "is required and at most 256 characters")
	}
	if env.Type == "" || len(env.Type) > MaxTypeLen {
		return fieldErr("type", fmt.Sprintf("is required and at most %d characters", MaxTypeLen))
	}
	if env.Time.IsZero() {
		return fieldErr("time", "is required (RFC 3339)")
	}
	// Data needs no check of its own: it is a value inside the envelope
	// decodeStrict shape-checked, and the data of a lifecycle, run or job
	// envelope (a payload and a checkpoint of up to MaxDataBytes each) has
	// only the envelope's limit. Producer data is held to MaxDataBytes by
	// ValidateEventEnvelope.
	return nil
}

// ValidateEventEnvelope checks the stricter rules of producer events (as on
// INGEST and EVENTS): a subject-safe id, a URI-reference source and a
// dotted type.
func ValidateEventEnvelope(env Envelope) error {
	if err := ValidateID("id", env.ID); err != nil {
		return err
	}
	if err := ValidateSource("source", env.Source); err != nil {
		return err
	}
	if err := ValidateType("type", env.Type); err != nil {
		return err
	}
	return checkRaw("data", env.Data)
}

// marshalWithData encodes env with data as its data member, as Marshal
// does, for data that json.Marshal has just written: compact, valid and
// HTML-escaped, so Marshal would copy it unchanged. Marshal scans a raw
// member byte by byte to compact it; a lifecycle message's data was
// scanned twice that way (its payload, then the whole data), which was a
// third of the cost of building one (BenchmarkNewDueMsg). data is the
// last member Marshal writes, so it is appended after the others.
func (env Envelope) marshalWithData(data []byte) ([]byte, error) {
	if len(data) == 0 || len(env.Extensions) > 0 {
		env.Data = data
		return env.Marshal()
	}
	env.Data = nil
	head, err := env.Marshal()
	if err != nil {
		return nil, err
	}
	out := make([]byte, 0, len(head)+len(`,"data":`)+len(data))
	out = append(out, head[:len(head)-1]...)
	out = append(out, `,"data":`...)
	out = append(out, data...)
	return append(out, '}'), nil
}

// Marshal encodes the envelope, its extension attributes as members of
// their own. It cannot fail for envelopes built by this package; an error
// means Data is not valid JSON.
func (env Envelope) Marshal() ([]byte, error) {
	b, err := json.Marshal(env)
	if err != nil {
		return nil, fmt.Errorf("marshal envelope: %w", err)
	}
	if len(env.Extensions) == 0 {
		return b, nil
	}
	return appendExtensions(b, env.Extensions)
}
