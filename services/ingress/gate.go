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

	"github.com/retryd/retryd/internal/durable"
	"github.com/retryd/retryd/pkg/contract"
	"github.com/retryd/retryd/projections/inbox"
	"github.com/retryd/retryd/projections/outbox"
	"github.com/retryd/retryd/services/ingress/internal/ingressstore"
)

// handleIngest is the gate: one event from INGEST, stored once and admitted
// or deferred in one transaction.
func (s *Service) handleIngest(ctx context.Context, msg jetstream.Msg) error {
	env, ingestSeq, err := decodeIngest(msg)
	if err != nil {
		return err
	}
	body, err := env.Marshal()
	if err != nil {
		return fmt.Errorf("%w: %w", contract.ErrInvalid, err)
	}
	ev := ingressstore.Event{ID: env.ID, Source: env.Source, Type: env.Type, Envelope: body}
	var duplicate bool
	var v ingressstore.Verdict
	err = s.inTx(ctx, func(tx pgx.Tx) error {
		first, err := inbox.Claim(ctx, tx, ConsumerGate, ev.ID)
		if err != nil {
			return err
		}
		if first {
			first, err = ingressstore.InsertEvent(ctx, tx, ev.ID, ev.Source, ev.Type, body, ingestSeq)
			if err != nil {
				return err
			}
		}
		if duplicate = !first; duplicate {
			return nil
		}
		if v, err = ingressstore.Gate(ctx, tx, ev.Source, ev.Type, ev.ID); err != nil {
			return err
		}
		return s.apply(ctx, tx, ev, 1, v)
	})
	source := s.metrics.sources.label(ev.Source)
	switch {
	case errors.Is(err, ingressstore.ErrTypeNotAllowed):
		s.metrics.gate.WithLabelValues(source, decisionRejected).Inc()
		// Counted as a gate rejection, not as malformed input.
		return durable.Reject(fmt.Errorf("type: %w", err))
	case errors.Is(err, ingressstore.ErrWindowFilled):
		// Rolled back: the event is evaluated again in a moment and
		// queues behind the window's admissions.
		return durable.NakAfter(windowFilledRetry)
	case err != nil:
		return fmt.Errorf("gate event %s: %w", ev.ID, err)
	case duplicate:
		s.metrics.gate.WithLabelValues(source, decisionDuplicate).Inc()
		s.log.Debug().Str("source", ev.Source).Str("event_id", ev.ID).Msg("event already stored")
		return nil
	}
	if err := s.cfg.Failpoint.At(ctx, FailpointGateCommitted); err != nil {
		return err
	}
	s.relay.Kick()
	if v.Admitted {
		s.metrics.gate.WithLabelValues(source, decisionAdmitted).Inc()
	} else {
		s.metrics.gate.WithLabelValues(source, decisionDeferred).Inc()
	}
	s.logVerdict(ev, 1, v)
	return nil
}

// decodeIngest validates a message from ingest.<source>: what intake
// publishes (a complete envelope) or what a producer published itself (a
// producer event whose id may be in Nats-Msg-Id only). A missing time is
// the stream's timestamp, so a redelivery stores the same envelope. It
// also returns the message's INGEST sequence (0 when unknown), the order
// a release line follows.
func decodeIngest(msg jetstream.Msg) (contract.Envelope, uint64, error) {
	source, err := contract.ParseIngestSubject(msg.Subject())
	if err != nil {
		return contract.Envelope{}, 0, err
	}
	ev, err := contract.DecodeProducerEvent(msg.Data())
	if err != nil {
		return contract.Envelope{}, 0, err
	}
	if ev.Source != source {
		return contract.Envelope{}, 0, invalid("source", fmt.Sprintf("%q does not match the subject %s", ev.Source, msg.Subject()))
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
		if _, err := ingressstore.SetEventStatus(ctx, tx, ev.ID, ingressstore.StatusAdmitted, ingressstore.StatusReceived, ingressstore.StatusDeferred); err != nil {
			return err
		}
		msgs := []*nats.Msg{eventMsg(ev.ID, ev.Source, ev.Type, ev.Envelope)}
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
