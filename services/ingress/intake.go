package ingress

import (
	"bytes"
	"context"
	"errors"
	"fmt"
	"net/http"
	"strconv"
	"sync"
	"time"

	"github.com/nats-io/nats.go"
	"github.com/nats-io/nats.go/jetstream"

	"github.com/retryd/retryd/internal/serve"
	"github.com/retryd/retryd/internal/streams"
	"github.com/retryd/retryd/pkg/contract"
	"github.com/retryd/retryd/pkg/tracing"
)

// HeaderIdempotencyKey names the request header whose value becomes the
// event id when the event has none.
const HeaderIdempotencyKey = "Idempotency-Key"

// codeUnavailable is the error code of a 503: the event was not stored in
// INGEST; send it again (with the same id).
const codeUnavailable = "unavailable"

// Accepted is the answer to an accepted event.
type Accepted struct {
	ID string `json:"id"`
	// Duplicate is true when an event with this id was already accepted;
	// nothing new was stored.
	Duplicate bool `json:"duplicate"`
}

var bodyBuffers = sync.Pool{New: func() any { return new(bytes.Buffer) }}

// readBody reads a request body of at most limit bytes into a pooled
// buffer; put it back with bodyBuffers.Put.
func readBody(w http.ResponseWriter, r *http.Request, limit int64) (*bytes.Buffer, error) {
	if err := serve.RequireJSON(r); err != nil {
		return nil, err
	}
	buf := bodyBuffers.Get().(*bytes.Buffer)
	buf.Reset()
	if _, err := buf.ReadFrom(http.MaxBytesReader(w, r.Body, limit)); err != nil {
		bodyBuffers.Put(buf)
		var tooLarge *http.MaxBytesError
		if errors.As(err, &tooLarge) {
			return nil, &contract.FieldError{Field: "body", Reason: fmt.Sprintf("is larger than the limit of %d bytes", limit), Err: contract.ErrTooLarge}
		}
		return nil, invalid("body", "could not be read: "+err.Error())
	}
	return buf, nil
}

// postEvent is POST /v1/events: one producer event, 202 after the PubAck.
func (s *Service) postEvent(w http.ResponseWriter, r *http.Request) {
	if !s.allowIntake(w, r) {
		return
	}
	start := time.Now()
	defer func() { s.metrics.intakeLatency.Observe(time.Since(start).Seconds()) }()
	buf, err := readBody(w, r, s.cfg.MaxBodyBytes)
	if err != nil {
		s.reject(w, "", err)
		return
	}
	defer bodyBuffers.Put(buf)
	// Binary mode (ce-* headers, the body is the data) or structured.
	ev, err := contract.DecodeProducerMsg(r.Header, buf.Bytes())
	if err != nil {
		s.reject(w, "", err)
		return
	}
	source := ev.Key() // the source as the gate knows it
	id, err := eventID(ev.ID, r.Header.Get(HeaderIdempotencyKey), -1)
	if err != nil {
		s.reject(w, source, err)
		return
	}
	if err := s.checkType(r.Context(), source, ev.Type, "type"); err != nil {
		s.reject(w, source, err)
		return
	}
	msg, err := ingestMsg(ev.Envelope(id, s.cfg.Now()))
	if err != nil {
		s.reject(w, source, err)
		return
	}
	ctx, cancel := context.WithTimeout(r.Context(), s.cfg.PublishTimeout)
	defer cancel()
	tracing.Inject(ctx, msg.Header) // the gate continues the request's trace
	ack, err := s.cfg.JS.PublishMsg(ctx, msg, jetstream.WithExpectStream(contract.StreamIngest))
	if err != nil {
		s.unavailable(w, source, id, err)
		return
	}
	s.count(source, ack.Duplicate)
	serve.WriteJSON(w, http.StatusAccepted, Accepted{ID: id, Duplicate: ack.Duplicate})
}

// eventID picks the event's id: the producer's, else the Idempotency-Key
// (with "-<index>" for the index-th event of a batch), else a new ULID.
func eventID(own, key string, index int) (string, error) {
	if key != "" {
		if err := contract.ValidateID(HeaderIdempotencyKey, key); err != nil {
			return "", err
		}
	}
	switch {
	case own != "" && key != "" && index < 0 && own != key:
		return "", invalid(HeaderIdempotencyKey, fmt.Sprintf("%q does not match the event's id %q", key, own))
	case own != "":
		return own, nil
	case key != "" && index >= 0:
		id := key + "-" + strconv.Itoa(index)
		return id, contract.ValidateID(HeaderIdempotencyKey, id)
	case key != "":
		return key, nil
	}
	return contract.NewID(), nil
}

// checkType answers 400 naming the type when the source restricts its
// types and typ is not one of them.
func (s *Service) checkType(ctx context.Context, source, typ, field string) error {
	ok, err := s.types.allows(ctx, source, typ)
	if err != nil {
		// Stay open: the gate checks again in its transaction.
		s.log.Warn().Err(err).Str("source", source).Msg("allowed types unknown, accepting; the gate will check")
	}
	if !ok {
		return invalid(field, fmt.Sprintf("%q is not an allowed type of source %q", typ, source))
	}
	return nil
}

// ingestMsg is the accepted event on ingest.<source> with Nats-Msg-Id = id.
func ingestMsg(env contract.Envelope) (*nats.Msg, error) {
	body, err := env.Marshal()
	if err != nil {
		return nil, invalid("data", err.Error())
	}
	msg := nats.NewMsg(contract.IngestSubject(env.Source))
	msg.Data = body
	msg.Header.Set(contract.HeaderMsgID, env.ID)
	msg.Header.Set(contract.HeaderContentType, contract.ContentTypeJSON)
	return msg, nil
}

func (s *Service) count(source string, duplicate bool) {
	result := resultAccepted
	if duplicate {
		result = resultDuplicate
	}
	s.metrics.intake.WithLabelValues(s.metrics.sources.label(source), result).Inc()
}

// reject answers 400 or 413; nothing was published.
func (s *Service) reject(w http.ResponseWriter, source string, err error) {
	label := ""
	if source != "" && contract.ValidateToken("source", source) == nil {
		label = s.metrics.sources.label(source)
	}
	s.metrics.intake.WithLabelValues(label, resultRejected).Inc()
	serve.WriteError(w, err)
}

// unavailable answers 503: JetStream did not acknowledge the event.
func (s *Service) unavailable(w http.ResponseWriter, source, id string, err error) {
	s.metrics.intake.WithLabelValues(s.metrics.sources.label(source), resultFailed).Inc()
	s.log.Warn().Err(err).Str("source", source).Str("event_id", id).Msg("publish to INGEST failed")
	w.Header().Set("Retry-After", retryAfter(err))
	serve.WriteJSON(w, http.StatusServiceUnavailable, serve.ErrorBody{Error: serve.ErrorDetail{
		Code:    codeUnavailable,
		Message: "the event was not stored, send it again with the same id: " + publishReason(err),
	}})
}

// retryAfter is the Retry-After of a 503 for err: a full INGEST stays
// full for a while (serve.RetryAfterFull), a lost PubAck is retried soon.
func retryAfter(err error) string {
	if streams.Full(err) {
		return serve.RetryAfterFull
	}
	return "1"
}

func publishReason(err error) string {
	switch {
	case streams.Full(err):
		return "INGEST is full (its max_bytes, or the storage of JetStream)"
	case errors.Is(err, context.DeadlineExceeded), errors.Is(err, nats.ErrTimeout):
		return "timed out waiting for JetStream"
	case errors.Is(err, jetstream.ErrNoStreamResponse), errors.Is(err, nats.ErrNoResponders):
		return "JetStream is not available"
	}
	return "JetStream refused it"
}

// batchRequest is the body of POST /v1/events:batch.
type batchRequest struct {
	Events []rawEvent `json:"events"`
}

// rawEvent keeps an event's bytes for strict decoding one by one.
type rawEvent []byte

func (e *rawEvent) UnmarshalJSON(b []byte) error {
	*e = append((*e)[:0], b...)
	return nil
}

// BatchResult is one event's outcome in a batch answer, in request order.
type BatchResult struct {
	ID        string             `json:"id"`
	Duplicate bool               `json:"duplicate"`
	Error     *serve.ErrorDetail `json:"error,omitempty"`
}

// BatchResponse is the answer to POST /v1/events:batch.
type BatchResponse struct {
	Results []BatchResult `json:"results"`
}

// postBatch is POST /v1/events:batch. Every event is validated first: one
// bad event rejects the batch (400 naming events[i].field) and nothing is
// published. Then all are published at once and the answer, 202, comes
// after every PubAck; when some could not be stored the answer is 503 and
// each result says whether its event was stored.
func (s *Service) postBatch(w http.ResponseWriter, r *http.Request) {
	if !s.allowIntake(w, r) {
		return
	}
	var req batchRequest
	if err := serve.DecodeJSON(r, s.cfg.MaxBatchBodyBytes, &req); err != nil {
		s.reject(w, "", err)
		return
	}
	switch {
	case req.Events == nil:
		s.reject(w, "", invalid("events", "is required"))
		return
	case len(req.Events) == 0:
		s.reject(w, "", invalid("events", "is empty"))
		return
	case len(req.Events) > s.cfg.MaxBatchEvents:
		s.reject(w, "", &contract.FieldError{Field: "events",
			Reason: fmt.Sprintf("has %d events, more than the limit of %d", len(req.Events), s.cfg.MaxBatchEvents), Err: contract.ErrTooLarge})
		return
	}
	key := r.Header.Get(HeaderIdempotencyKey)
	msgs := make([]*nats.Msg, len(req.Events))
	sources := make([]string, len(req.Events))
	now := s.cfg.Now()
	for i, raw := range req.Events {
		msg, source, err := s.batchItem(r.Context(), raw, key, i, now)
		if err != nil {
			s.reject(w, source, prefixField(fmt.Sprintf("events[%d]", i), err))
			return
		}
		msgs[i], sources[i] = msg, source
	}
	ctx, cancel := context.WithTimeout(r.Context(), s.cfg.PublishTimeout)
	defer cancel()
	futures := make([]jetstream.PubAckFuture, len(msgs))
	results := make([]BatchResult, len(msgs))
	failed, full := false, false
	for i, msg := range msgs {
		results[i].ID = msg.Header.Get(contract.HeaderMsgID)
		tracing.Inject(ctx, msg.Header)
		f, err := s.cfg.JS.PublishMsgAsync(msg, jetstream.WithExpectStream(contract.StreamIngest), jetstream.WithStallWait(s.cfg.PublishTimeout))
		if err != nil {
			failed = true
			results[i].Error = s.publishFailed(sources[i], results[i].ID, err)
			continue
		}
		futures[i] = f
	}
	for i, f := range futures {
		if f == nil {
			continue
		}
		select {
		case ack := <-f.Ok():
			results[i].Duplicate = ack.Duplicate
			s.count(sources[i], ack.Duplicate)
		case err := <-f.Err():
			failed, full = true, full || streams.Full(err)
			results[i].Error = s.publishFailed(sources[i], results[i].ID, err)
		case <-ctx.Done():
			failed = true
			results[i].Error = s.publishFailed(sources[i], results[i].ID, ctx.Err())
		}
	}
	status := http.StatusAccepted
	if failed {
		status = http.StatusServiceUnavailable
		w.Header().Set("Retry-After", "1")
		if full {
			w.Header().Set("Retry-After", serve.RetryAfterFull)
		}
	}
	serve.WriteJSON(w, status, BatchResponse{Results: results})
}

func (s *Service) batchItem(ctx context.Context, raw rawEvent, key string, i int, now time.Time) (*nats.Msg, string, error) {
	ev, err := contract.DecodeProducerEvent(raw)
	if err != nil {
		return nil, "", err
	}
	source := ev.Key()
	id, err := eventID(ev.ID, key, i)
	if err != nil {
		return nil, source, err
	}
	if err := s.checkType(ctx, source, ev.Type, "type"); err != nil {
		return nil, source, err
	}
	msg, err := ingestMsg(ev.Envelope(id, now))
	return msg, source, err
}

func (s *Service) publishFailed(source, id string, err error) *serve.ErrorDetail {
	s.metrics.intake.WithLabelValues(s.metrics.sources.label(source), resultFailed).Inc()
	s.log.Warn().Err(err).Str("source", source).Str("event_id", id).Msg("publish to INGEST failed")
	return &serve.ErrorDetail{Code: codeUnavailable, Message: "not stored, send it again with the same id: " + publishReason(err)}
}

// prefixField names a batch item's field: events[3].type.
func prefixField(prefix string, err error) error {
	var fe *contract.FieldError
	if !errors.As(err, &fe) {
		return err
	}
	field := prefix
	if fe.Field != "" && fe.Field != "event" {
		field += "." + fe.Field
	}
	return &contract.FieldError{Field: field, Reason: fe.Reason, Err: fe.Err}
}
