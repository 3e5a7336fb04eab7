package ingress

import (
	"context"
	"errors"

	"github.com/nats-io/nats.go/jetstream"

	"github.com/retryd/retryd/pkg/contract"
)

// termError marks a message that can never be processed: it is terminated
// with its reason instead of being delivered again.
type termError struct {
	reason string
	// counted is set when the handler already counted the message (e.g. as
	// a gate rejection) so it is not also counted as malformed.
	counted bool
}

func (e *termError) Error() string { return e.reason }

func terminate(err error) error { return &termError{reason: err.Error()} }

// maxTermReason keeps the reason sent to the server short.
const maxTermReason = 256

// dispatch adapts a handler to JetStream: ack after success, terminate
// malformed input (counted and logged without its content), leave a
// message alone at a failpoint, and ask for a later delivery otherwise.
func (s *Service) dispatch(consumer string, handle func(ctx context.Context, msg jetstream.Msg) error) jetstream.MessageHandler {
	log := s.log.With().Str("consumer", consumer).Logger()
	return func(msg jetstream.Msg) {
		err := handle(s.runCtx, msg)
		var term *termError
		var fp *failpointError
		switch {
		case err == nil:
			if err := msg.Ack(); err != nil {
				// The message comes back and the inbox recognises it.
				log.Warn().Err(err).Str("subject", msg.Subject()).Msg("ack failed")
			}
		case errors.As(err, &fp):
			log.Warn().Str("failpoint", fp.point).Str("subject", msg.Subject()).Msg("stopped at failpoint")
		case errors.As(err, &term) || errors.Is(err, contract.ErrInvalid) || errors.Is(err, contract.ErrTooLarge):
			reason := err.Error()
			if len(reason) > maxTermReason {
				reason = reason[:maxTermReason]
			}
			if term == nil || !term.counted {
				s.metrics.malformed.WithLabelValues(consumer).Inc()
			}
			log.Warn().Str("subject", msg.Subject()).Str("reason", reason).Msg("message terminated")
			if err := msg.TermWithReason(reason); err != nil {
				log.Warn().Err(err).Str("subject", msg.Subject()).Msg("term failed")
			}
		default:
			var delivered uint64 = 1
			if md, mdErr := msg.Metadata(); mdErr == nil {
				delivered = md.NumDelivered
			}
			delay := nakDelay(delivered)
			log.Error().Err(err).Str("subject", msg.Subject()).Uint64("delivered", delivered).Dur("retry_in", delay).Msg("message failed, delivering again later")
			if err := msg.NakWithDelay(delay); err != nil {
				log.Warn().Err(err).Str("subject", msg.Subject()).Msg("nak failed")
			}
		}
	}
}

func (s *Service) consumeError(consumer string) jetstream.ConsumeErrHandler {
	log := s.log.With().Str("consumer", consumer).Logger()
	return func(_ jetstream.ConsumeContext, err error) {
		if errors.Is(err, jetstream.ErrNoHeartbeat) || errors.Is(err, jetstream.ErrConsumerDeleted) {
			log.Error().Err(err).Msg("consume error")
			return
		}
		log.Debug().Err(err).Msg("consume error")
	}
}
