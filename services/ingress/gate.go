package ingress

import (
	"context"
	"errors"
	"fmt"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/nats-io/nats.go"
	"github.com/nats-io/nats.go/jetstream"
	"github.com/rs/zerolog"
	"go.opentelemetry.io/otel/trace"

	"github.com/retryd/retryd/internal/durable"
	"github.com/retryd/retryd/internal/inbox"
	"github.com/retryd/retryd/internal/outbox"
	"github.com/retryd/retryd/pkg/contract"
	"github.com/retryd/retryd/pkg/tracing"
	"github.com/retryd/retryd/services/ingress/internal/ingressstore"
)

// ingestItem is one decoded message of INGEST.
type ingestItem struct {
	msg jetstream.Msg
	ev  ingressstore.Event
	seq uint64
	// ctx carries the message's consumer span; the outbox rows written for
	// it continue that trace.
	ctx  context.Context
	span trace.Span
}

// gated is what the gate decided for one event.
type gated struct {
	duplicate bool
	v         ingressstore.Verdict
}

// newIngestItem decodes msg and starts its consumer span.
func newIngestItem(ctx context.Context, msg jetstream.Msg) (ingestItem, error) {
	env, seq, err := decodeIngest(msg)
	if err != nil {
		return ingestItem{}, err
	}
	body, err := env.Marshal()
	if err != nil {
		return ingestItem{}, fmt.Errorf("%w: %w", contract.ErrInvalid, err)
	}
	// The gate, its store and its API know a source by its key: the
	// source itself, or a token for a URI-reference (contract.SourceKey).
	it := ingestItem{msg: msg, seq: seq, ev: ingressstore.Event{ID: env.ID, Source: contract.SourceKey(env.Source), Type: env.Type, Envelope: body}}
	it.ctx, it.span = tracing.StartConsume(ctx, msg.Subject(), ConsumerGate, msg.Headers())
	return it, nil
}

// gateEvent stores it's event once and admits or defers it, inside tx.
func (s *Service) gateEvent(tx pgx.Tx, it ingestItem) (gated, error) {
	ctx, ev := it.ctx, it.ev
	first, err := inbox.Claim(ctx, tx, ConsumerGate, ev.ID)
	if err != nil {
		return gated{}, err
	}
	if first {
		first, err = ingressstore.InsertEvent(ctx, tx, ev.ID, ev.Source, ev.Type, ev.Envelope, it.seq)
		if err != nil {
			return gated{}, err
		}
	}
	if !first {
		return gated{duplicate: true}, nil
	}
	v, err := ingressstore.Gate(ctx, tx, ev.Source, ev.Type, ev.ID)
	if err != nil {
		return gated{}, err
	}
	return gated{v: v}, s.apply(ctx, tx, ev, 1, v)
}

// gateError is how a message whose event the gate could not decide is
// settled.
func (s *Service) gateError(it ingestItem, err error) error {
	switch {
	case errors.Is(err, ingressstore.ErrTypeNotAllowed):
		s.metrics.gate.WithLabelValues(s.metrics.sources.label(it.ev.Source), decisionRejected).Inc()
		// Counted as a gate rejection, not as malformed input.
		return durable.Reject(fmt.Errorf("type: %w", err))
	case errors.Is(err, ingressstore.ErrWindowFilled):
		// Rolled back: the event is evaluated again in a moment and
		// queues behind the window's admissions.
		return durable.NakAfter(windowFilledRetry)
	}
	return fmt.Errorf("gate event %s: %w", it.ev.ID, err)
}

// reportGated counts and logs a decision once it is committed.
func (s *Service) reportGated(it ingestItem, g gated) {
	source := s.metrics.sources.label(it.ev.Source)
	switch {
	case g.duplicate:
		s.metrics.gate.WithLabelValues(source, decisionDuplicate).Inc()
		s.log.Debug().Str("source", it.ev.Source).Str("event_id", it.ev.ID).Msg("event already stored")
		return
	case g.v.Admitted:
		s.metrics.gate.WithLabelValues(source, decisionAdmitted).Inc()
	default:
		s.metrics.gate.WithLabelValues(source, decisionDeferred).Inc()
	}
	s.logVerdict(it.ev, 1, g.v)
}

// decodeIngest validates a message from ingest.<source>: what intake
// publishes (a complete envelope) or what a producer published itself (a
// producer event, in structured or binary mode, whose id may be in
// Nats-Msg-Id only). A missing time is
// the stream's timestamp, so a redelivery stores the same envelope. It
// also returns the message's INGEST sequence (0 when unknown), the order
// a release line follows.
func decodeIngest(msg jetstream.Msg) (contract.Envelope, uint64, error) {
	source, err := contract.ParseIngestSubject(msg.Subject())
	if err != nil {
		return contract.Envelope{}, 0, err
	}
	ev, err := contract.DecodeProducerMsg(msg.Headers(), msg.Data())
	if err != nil {
		return contract.Envelope{}, 0, err
	}
	if ev.Key() != source {
		return contract.Envelope{}, 0, invalid("source", fmt.Sprintf("%q does not match the subject %s (its key is %q)", ev.Source, msg.Subject(), ev.Key()))
	}
	var hdrID string
	if h := msg.Headers(); h != nil {
		hdrID = h.Get(nats.MsgIdHdr)
	}
	id := ev.ID
	switch {
	case id == "" && hdrID == "":
		return contract.Envelope{}, 0, invalid("id", "is required: set the event's id or the Nats-Msg-Id header")
	case id == "":
		if err := contract.ValidateID("Nats-Msg-Id", hdrID); err != nil {
			return contract.Envelope{}, 0, err
		}
		id = hdrID
	case hdrID != "" && hdrID != id:
		return contract.Envelope{}, 0, invalid("id", fmt.Sprintf("%q does not match the Nats-Msg-Id header %q", id, hdrID))
	}
	at, seq := time.Now(), uint64(0)
	if md, err := msg.Metadata(); err == nil {
		at, seq = md.Timestamp, md.Sequence.Stream
	}
	return ev.Envelope(id, at), seq, nil
}

func invalid(field, reason string) error {
	return &contract.FieldError{Field: field, Reason: reason, Err: contract.ErrInvalid}
}

// apply carries out the gate's verdict for attempt of ev inside tx: admit
// (status admitted, events.<source>.<type>, and succeeded when it was a
// retry) or defer (status deferred, the retry row, and held).
func (s *Service) apply(ctx context.Context, tx pgx.Tx, ev ingressstore.Event, attempt int, v ingressstore.Verdict) error {
	now := s.cfg.Now()
	if v.Admitted {
		// v.Now is the time the admission counts in its rate window.
		if _, err := ingressstore.AdmitEventAt(ctx, tx, ev.ID, v.Now, ingressstore.StatusReceived, ingressstore.StatusDeferred); err != nil {
			return err
		}
		// Late holders admitted ahead of it first, in line order: the
		// relay publishes in insert order. Their dues, when they come,
		// publish their succeeded (dueForAdmittedEvent).
		msgs := make([]*nats.Msg, 0, len(v.Before)+2)
		for _, b := range v.Before {
			msgs = append(msgs, eventMsg(b.ID, b.Source, b.Type, b.Envelope))
		}
		msgs = append(msgs, eventMsg(ev.ID, ev.Source, ev.Type, ev.Envelope))
		if attempt > 1 {
			if err := ingressstore.CompleteRetry(ctx, tx, ev.ID, attempt); err != nil {
				return err
			}
			m, err := succeededMsg(ev.ID, ev.Source, attempt, now)
			if err != nil {
				return err
			}
			msgs = append(msgs, m)
		}
		if err := outbox.Insert(ctx, tx, OutboxOwner, msgs...); err != nil {
			return err
		}
		// Last: the source's rate window row stays locked until the
		// commit, and only for the commit.
		return ingressstore.CountAdmission(ctx, tx, v)
	}
	if _, err := ingressstore.SetEventStatus(ctx, tx, ev.ID, ingressstore.StatusDeferred, ingressstore.StatusReceived, ingressstore.StatusDeferred); err != nil {
		return err
	}
	d := s.newDeferral(ev, attempt, v)
	if err := ingressstore.RecordDeferral(ctx, tx, d.record()); err != nil {
		return err
	}
	if !v.Now.IsZero() {
		now = v.Now
	}
	m, err := heldMsg(d, now)
	if err != nil {
		return err
	}
	return outbox.Insert(ctx, tx, OutboxOwner, m)
}

func (s *Service) logVerdict(ev ingressstore.Event, attempt int, v ingressstore.Verdict) {
	source := s.metrics.sources.label(ev.Source)
	if v.Admitted {
		level := zerolog.DebugLevel
		if attempt > 1 {
			level = zerolog.InfoLevel
			s.metrics.retry(ev.Source, retryCompleted)
		}
		s.log.WithLevel(level).Str("source", ev.Source).Str("event_id", ev.ID).Str("type", ev.Type).
			Int("attempt", attempt).Msg("event admitted")
		return
	}
	s.metrics.deferrals.WithLabelValues(source, v.Reason).Inc()
	e := s.log.Info().Str("source", ev.Source).Str("event_id", ev.ID).Str("type", ev.Type).
		Int("attempt", attempt).Str("reason", v.Reason)
	if !v.RetryAt.IsZero() {
		e = e.Time("retry_after", v.RetryAt)
	}
	e.Msg("event deferred")
}
