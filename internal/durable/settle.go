package durable

import (
	"errors"

	"github.com/nats-io/nats.go/jetstream"
	"github.com/rs/zerolog"

	"github.com/retryd/retryd/pkg/contract"
)

// handler runs the spec's handler on one message and settles it.
func (g *Group) handler(s Spec) jetstream.MessageHandler {
	consumer := s.Config.Durable
	log := g.log.With().Str("consumer", consumer).Logger()
	return func(msg jetstream.Msg) {
		g.gate.RLock()
		if g.closed {
			// Stopped without a drain: delivered again after the ack wait.
			g.gate.RUnlock()
			return
		}
		g.inflight.Add(1)
		g.gate.RUnlock()
		defer g.inflight.Done()
		g.settle(consumer, log, msg, s.Handle(g.handleCtx, msg))
	}
}

func (g *Group) settle(consumer string, log zerolog.Logger, msg jetstream.Msg, err error) {
	var reject *rejectError
	var later *nakAfterError
	switch {
	case err == nil:
		if err := msg.Ack(); err != nil {
			// The message comes back and the handler finds it applied.
			log.Warn().Err(err).Str("subject", msg.Subject()).Msg("ack failed")
		}
	case errors.Is(err, ErrAbandon):
		log.Warn().Str("subject", msg.Subject()).Msg("message abandoned unacked")
	case errors.As(err, &later):
		log.Debug().Str("subject", msg.Subject()).Dur("retry_in", later.delay).Msg("message handed back until it can be applied")
		if err := msg.NakWithDelay(later.delay); err != nil {
			log.Warn().Err(err).Str("subject", msg.Subject()).Msg("nak failed")
		}
	case errors.As(err, &reject) || errors.Is(err, contract.ErrInvalid) || errors.Is(err, contract.ErrTooLarge):
		reason := contract.LogReason(err)
		if reject == nil && g.cfg.Malformed != nil {
			g.cfg.Malformed.WithLabelValues(consumer).Inc()
		}
		log.Warn().Str("subject", msg.Subject()).Str("reason", reason).Msg("message terminated")
		if err := msg.TermWithReason(reason); err != nil {
			log.Warn().Err(err).Str("subject", msg.Subject()).Msg("term failed")
		}
	default:
		if g.cfg.Failed != nil {
			g.cfg.Failed.WithLabelValues(consumer).Inc()
		}
		var delivered uint64 = 1
		if md, mdErr := msg.Metadata(); mdErr == nil {
			delivered = md.NumDelivered
		}
		delay := g.cfg.NakDelay(delivered)
		log.Error().Err(err).Str("subject", msg.Subject()).Uint64("delivered", delivered).Dur("retry_in", delay).
			Msg("message failed, delivering it again later")
		if err := msg.NakWithDelay(delay); err != nil {
			log.Warn().Err(err).Str("subject", msg.Subject()).Msg("nak failed")
		}
	}
}

func (g *Group) consumeError(consumer string) jetstream.ConsumeErrHandler {
	log := g.log.With().Str("consumer", consumer).Logger()
	return func(_ jetstream.ConsumeContext, err error) {
		switch {
		case errors.Is(err, jetstream.ErrNoHeartbeat) || errors.Is(err, jetstream.ErrConsumerDeleted):
			// A deleted consumer ends the consume context: check now
			// rather than stay deaf until the next interval.
			log.Error().Err(err).Msg("consume error")
			g.requestCheck()
		case errors.Is(err, jetstream.ErrConsumerNotFound) || errors.Is(err, jetstream.ErrStreamNotFound):
			log.Warn().Err(err).Msg("consume error")
			g.requestCheck()
		default:
			log.Debug().Err(err).Msg("consume error")
		}
	}
}

// transient reports whether err hands its message back as a failure (the
// database is away), rather than settling it by one of the handler
// contract's answers.
func transient(err error) bool {
	var reject *rejectError
	var later *nakAfterError
	return err != nil && !errors.Is(err, ErrAbandon) && !errors.As(err, &later) && !errors.As(err, &reject) &&
		!errors.Is(err, contract.ErrInvalid) && !errors.Is(err, contract.ErrTooLarge)
}
