package ingress

import (
	"context"
	"errors"

	"github.com/jackc/pgx/v5"
	"github.com/nats-io/nats.go/jetstream"
	"golang.org/x/sync/errgroup"

	"github.com/retryd/retryd/internal/durable"
	"github.com/retryd/retryd/pkg/tracing"
	"github.com/retryd/retryd/services/ingress/internal/ingressstore"
)

// handleIngest is the gate: the consumer runtime hands it the messages of
// INGEST in stream order, a batch at a time, and it decides the events of
// each source in that order, in one transaction per source. A rate-limited
// source's admissions and slots therefore follow arrival order whatever
// Config.Concurrency is (handing messages to parallel workers gave slots
// in the order the workers happened to reach the source: 7,110 of a
// 10,000-event burst out of place). Sources are decided side by side, up
// to Config.Concurrency at once. Order holds within one ingress instance;
// instances sharing the gate consumer each keep the order of what they
// are handed.
func (s *Service) handleIngest(ctx context.Context, msgs []jetstream.Msg) error {
	var sources []string
	bySource := map[string][]ingestItem{}
	for _, m := range msgs {
		it, err := newIngestItem(ctx, m)
		if err != nil {
			durable.Settle(m, err)
			continue
		}
		if _, ok := bySource[it.ev.Source]; !ok {
			sources = append(sources, it.ev.Source)
		}
		bySource[it.ev.Source] = append(bySource[it.ev.Source], it)
	}
	var g errgroup.Group
	g.SetLimit(s.cfg.Concurrency)
	for _, source := range sources {
		g.Go(func() error { return s.gateSource(bySource[source]) })
	}
	// Only a failpoint's error comes back: it leaves the messages of its
	// source unsettled, as if the process died after the commit.
	return g.Wait()
}

// gateSource decides the events of one source, in order, in one
// transaction. When that transaction fails (an event of a type the source
// does not allow, a window another instance filled, the database), each
// event is decided again alone, still in order, so one event cannot hold
// back the others.
func (s *Service) gateSource(items []ingestItem) error {
	defer func() {
		for _, it := range items {
			it.span.End()
		}
	}()
	out := make([]gated, len(items))
	err := s.inTx(items[0].ctx, func(tx pgx.Tx) error {
		for i, it := range items {
			g, err := s.gateEvent(tx, it)
			if err != nil {
				return err
			}
			out[i] = g
		}
		return nil
	})
	if err != nil {
		if !errors.Is(err, ingressstore.ErrTypeNotAllowed) && !errors.Is(err, ingressstore.ErrWindowFilled) {
			s.log.Warn().Err(err).Str("source", items[0].ev.Source).Int("events", len(items)).
				Msg("gate transaction failed: deciding its events one at a time")
		}
		return s.gateEach(items)
	}
	if err := s.cfg.Failpoint.At(items[0].ctx, FailpointGateCommitted); err != nil {
		return err
	}
	s.relay.Kick()
	for i, it := range items {
		s.reportGated(it, out[i])
		durable.Settle(it.msg, nil)
	}
	return nil
}

// gateEach decides items one at a time, each in its own transaction.
func (s *Service) gateEach(items []ingestItem) error {
	for _, it := range items {
		var g gated
		err := s.inTx(it.ctx, func(tx pgx.Tx) error {
			var err error
			g, err = s.gateEvent(tx, it)
			return err
		})
		if err != nil {
			err = s.gateError(it, err)
			tracing.Fail(it.span, err)
			durable.Settle(it.msg, err)
			continue
		}
		if err := s.cfg.Failpoint.At(it.ctx, FailpointGateCommitted); err != nil {
			return err
		}
		s.relay.Kick()
		s.reportGated(it, g)
		durable.Settle(it.msg, nil)
	}
	return nil
}
