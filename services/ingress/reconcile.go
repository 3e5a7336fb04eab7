package ingress

import (
	"context"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/nats-io/nats.go"

	"github.com/retryd/retryd/internal/inbox"
	"github.com/retryd/retryd/internal/outbox"
	"github.com/retryd/retryd/pkg/errclass"
	"github.com/retryd/retryd/services/ingress/internal/ingressstore"
)

// reconcileBatch is how many deferrals one reconciliation transaction
// handles.
const reconcileBatch = 500

// reconcileLoop runs at start and every ReconcileInterval: it publishes
// again the held event of deferrals the scheduler never confirmed and
// prunes ended rate windows and old inbox rows. It holds no state of its
// own; everything it needs is in Postgres. (The consumers recreate
// themselves, at the same interval.)
func (s *Service) reconcileLoop(ctx context.Context) {
	t := time.NewTicker(s.cfg.ReconcileInterval)
	defer t.Stop()
	for {
		n, err := s.Reconcile(ctx)
		if err != nil && ctx.Err() == nil {
			s.log.Error().Err(err).Msg("reconcile deferrals")
		} else if n > 0 {
			s.log.Info().Int("republished", n).Msg("republished held events of unconfirmed deferrals")
		}
		s.prune(ctx)
		select {
		case <-ctx.Done():
			return
		case <-t.C:
		}
	}
}

// Reconcile publishes again, through the outbox, the held event of every
// deferral the scheduler has not confirmed for ReconcileAfter: its held
// event was lost (RETRIES purged) or not consumed yet. The republished
// message has the original's Nats-Msg-Id and content, so a scheduler that
// had it already ignores it. It returns how many it republished.
func (s *Service) Reconcile(ctx context.Context) (int, error) {
	total := 0
	for {
		n := 0
		err := s.inTx(ctx, func(tx pgx.Tx) error {
			rows, err := ingressstore.Unconfirmed(ctx, tx, s.cfg.ReconcileAfter, reconcileBatch)
			if err != nil {
				return err
			}
			n = len(rows)
			msgs := make([]*nats.Msg, 0, len(rows))
			for _, r := range rows {
				m, err := s.reheldMsg(ctx, tx, r)
				if err != nil {
					return err
				}
				if m != nil {
					msgs = append(msgs, m)
				}
				if err := ingressstore.Touch(ctx, tx, r.EventID); err != nil {
					return err
				}
			}
			if len(msgs) == 0 {
				return nil
			}
			return outbox.Insert(ctx, tx, OutboxOwner, msgs...)
		})
		if err != nil {
			return total, err
		}
		total += n
		if n > 0 {
			s.metrics.reconciled.Add(float64(n))
			s.relay.Kick()
		}
		if n < reconcileBatch {
			return total, nil
		}
	}
}

// reheldMsg rebuilds the held event of a deferral from its row.
func (s *Service) reheldMsg(ctx context.Context, tx pgx.Tx, r ingressstore.Retry) (*nats.Msg, error) {
	ev, err := ingressstore.GetEvent(ctx, tx, r.EventID)
	if err != nil {
		return nil, err
	}
	if ev.Status != ingressstore.StatusDeferred {
		return nil, nil
	}
	reason, _ := r.Metadata["reason"].(string)
	class, _ := r.Metadata["class"].(string)
	if reason == "" {
		reason = ingressstore.ReasonSourceThrottled
	}
	if class == "" {
		class = string(errclass.RateLimit)
	}
	d := deferral{id: r.EventID, source: r.Source, typ: ev.Type, attempt: max(r.Attempts, 1),
		reason: reason, class: errclass.Class(class)}
	// The row's last error is "<reason>: <detail>".
	if len(r.LastError) > len(reason)+2 {
		d.detail = r.LastError[len(reason)+2:]
	}
	if at, ok := r.Metadata["retry_after"].(string); ok {
		if t, err := time.Parse(time.RFC3339Nano, at); err == nil {
			d.retryAt = t
		}
	}
	return heldMsg(d, r.UpdatedAt)
}

// prune deletes ended rate windows and, unless disabled, old inbox rows.
func (s *Service) prune(ctx context.Context) {
	if _, err := ingressstore.PruneWindows(ctx, s.cfg.Pool, s.cfg.WindowRetention); err != nil && ctx.Err() == nil {
		s.log.Warn().Err(err).Msg("prune rate windows")
	}
	if s.cfg.InboxRetention > 0 {
		if _, err := inbox.Prune(ctx, s.cfg.Pool, s.cfg.InboxRetention, ConsumerGate, ConsumerRetry, ConsumerRetryState); err != nil && ctx.Err() == nil {
			s.log.Warn().Err(err).Msg("prune inbox")
		}
	}
}
