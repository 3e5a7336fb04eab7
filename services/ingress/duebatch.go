package ingress

import (
	"context"
	"errors"
	"fmt"

	"github.com/jackc/pgx/v5"
	"github.com/nats-io/nats.go/jetstream"
	"go.opentelemetry.io/otel/trace"
	"golang.org/x/sync/errgroup"

	"github.com/retryd/retryd/internal/durable"
	"github.com/retryd/retryd/pkg/contract"
	"github.com/retryd/retryd/pkg/tracing"
	"github.com/retryd/retryd/services/ingress/internal/ingressstore"
)

// dueItem is one decoded due of RETRIES and what deciding it did.
type dueItem struct {
	msg       jetstream.Msg
	due       *contract.DueData
	msgID     string
	delivered uint64
	ctx       context.Context
	span      trace.Span
	out       dueOutcome
	// err is the decision's error; the decision rolled back to its
	// savepoint.
	err error
}

// handleDues evaluates deferred events again when the scheduler says
// their next attempts are due. The runtime hands it RETRIES' dues in
// stream order, which is the order the scheduler emits them, by due
// time: the dues of one source are decided in that order, in one
// transaction, so a holder whose due comes right behind another's never
// commits first (with dues handed to parallel workers it did: 617 of a
// 10,000-event throttled burst reached EVENTS out of place). Sources are
// decided side by side, up to Config.Concurrency at once.
func (s *Service) handleDues(ctx context.Context, msgs []jetstream.Msg) error {
	var sources []string
	bySource := map[string][]*dueItem{}
	for _, m := range msgs {
		due, msgID, err := decodeDue(m)
		if err != nil {
			durable.Settle(m, err)
			continue
		}
		it := &dueItem{msg: m, due: due, msgID: msgID, delivered: 1}
		if md, err := m.Metadata(); err == nil {
			it.delivered = md.NumDelivered
		}
		it.ctx, it.span = tracing.StartConsume(ctx, m.Subject(), ConsumerRetry, m.Headers())
		if _, ok := bySource[due.Source]; !ok {
			sources = append(sources, due.Source)
		}
		bySource[due.Source] = append(bySource[due.Source], it)
	}
	var g errgroup.Group
	g.SetLimit(s.cfg.Concurrency)
	for _, source := range sources {
		g.Go(func() error { return s.decideDues(bySource[source]) })
	}
	// Only a failpoint's error comes back: it leaves the dues of its
	// source unsettled, as if the process died after the commit.
	return g.Wait()
}

// decideDues decides the dues of one source in order, each under its own
// savepoint in one transaction: a due that must wait (its turn, a release
// line, a window another instance filled) rolls back alone and is handed
// back after the commit. Once one finds its window filled by another
// instance, the dues behind it are handed back with it, so none passes
// it.
func (s *Service) decideDues(items []*dueItem) error {
	defer func() {
		for _, it := range items {
			it.span.End()
		}
	}()
	err := s.inTx(items[0].ctx, func(tx pgx.Tx) error {
		filled := false
		for _, it := range items {
			if filled {
				it.err = ingressstore.ErrWindowFilled
				continue
			}
			it.err = pgx.BeginFunc(it.ctx, tx, func(sp pgx.Tx) error {
				var err error
				it.out, err = s.decideDue(it.ctx, sp, it.msgID, it.due, it.delivered < unconfirmedDeliveries)
				if err == nil && it.out.result == dueUndecided {
					err = errors.New("no outcome decided")
				}
				return err
			})
			filled = errors.Is(it.err, ingressstore.ErrWindowFilled)
		}
		return nil
	})
	if err != nil {
		for _, it := range items {
			err := fmt.Errorf("handle due %s: %w", it.msgID, err)
			tracing.Fail(it.span, err)
			durable.Settle(it.msg, err)
		}
		return nil
	}
	answers := make([]error, len(items))
	decided := false
	for i, it := range items {
		var d bool
		answers[i], d = s.dueAnswer(it.ctx, it)
		decided = decided || d
	}
	if decided {
		if err := s.cfg.Failpoint.At(items[0].ctx, FailpointRetryCommitted); err != nil {
			return err
		}
		s.relay.Kick()
	}
	for i, it := range items {
		if answers[i] == nil && it.out.result != dueDuplicate {
			s.reportDue(it.due, it.out)
		}
		tracing.Fail(it.span, answers[i])
		durable.Settle(it.msg, answers[i])
	}
	return nil
}
