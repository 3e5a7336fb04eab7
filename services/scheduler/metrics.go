package scheduler

import (
	"context"
	"fmt"

	"github.com/prometheus/client_golang/prometheus"

	"github.com/retryd/retryd/internal/promreg"
	"github.com/retryd/retryd/internal/wait"
	"github.com/retryd/retryd/pkg/contract"
	"github.com/retryd/retryd/stores/retrystore"
)

type metrics struct {
	scheduled, rescheduled, due, succeeded, exhausted, cancelled *prometheus.CounterVec
	exhaustedBy                                                  *prometheus.CounterVec

	redue, dueDuplicates *prometheus.CounterVec
	lateness             prometheus.Histogram
	pending              *prometheus.GaugeVec
	outboxPending        prometheus.Gauge
	outboxLag            prometheus.Gauge
	policyLag            prometheus.Gauge
	releasesPending      prometheus.Gauge
	busy                 prometheus.Counter
	inProgress           prometheus.Counter

	malformed, duplicate, stale, errors *prometheus.CounterVec
}

// latenessBuckets run from 1ms to 60s.
var latenessBuckets = []float64{0.001, 0.0025, 0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1, 2.5, 5, 10, 30, 60}

func newMetrics(reg prometheus.Registerer) (*metrics, error) {
	// Several schedulers on one registry (the dev runner, tests) share the
	// collectors registered first.
	b := promreg.Builder{Reg: reg, Namespace: "retryd", Subsystem: "scheduler"}
	m := &metrics{
		scheduled:   b.CounterVec("scheduled_total", "First retries scheduled.", "kind"),
		rescheduled: b.CounterVec("rescheduled_total", "Later retries scheduled, manual retries included.", "kind"),
		due:         b.CounterVec("due_total", "Due events emitted (stored by JetStream for the first time).", "kind"),
		succeeded:   b.CounterVec("succeeded_total", "Retried items that succeeded.", "kind"),
		exhausted:   b.CounterVec("exhausted_total", "Items exhausted (dead-lettered).", "kind"),
		exhaustedBy: b.CounterVec("exhausted_by_class_total",
			"Items exhausted, by the class of their last error (none for a hold that expired) and the reason (max_retries, non_retryable, retries_disabled, hold_expired).",
			"kind", "class", "reason"),
		cancelled:     b.CounterVec("cancelled_total", "Items cancelled.", "kind"),
		redue:         b.CounterVec("redue_total", "Due events emitted again because the owner reported no outcome within RedueAfter.", "kind"),
		dueDuplicates: b.CounterVec("due_duplicates_total", "Due publishes JetStream absorbed as duplicates of an earlier publish (same Nats-Msg-Id).", "kind"),
		lateness: b.Histogram("due_lateness_seconds",
			"Time from next_attempt_at to the publish of the due event, by the database clock.", latenessBuckets),
		pending: b.GaugeVec("pending",
			"Retries waiting (state scheduled) or out for an outcome (state due).", "kind", "state"),
		outboxPending: b.Gauge("outbox_pending",
			"Lifecycle events in the scheduler's outbox not yet published."),
		outboxLag: b.Gauge("outbox_lag_seconds",
			"Age of the oldest unpublished event in the scheduler's outbox (0 when empty)."),
		malformed: b.CounterVec("malformed_total", "Messages terminated because they could not be decoded.", "consumer"),
		duplicate: b.CounterVec("duplicate_total", "Messages already applied (inbox hit), acked without effect.", "consumer"),
		stale:     b.CounterVec("stale_total", "Facts ignored because the row moved past them (old attempt or terminal state).", "kind", "event"),
		errors:    b.CounterVec("errors_total", "Failed transactions or publishes by stage (retried).", "stage"),
		policyLag: b.Gauge("policy_lag_seconds",
			"How far the policy stage is behind RETRIES: the age of the newest applied fact while the consumer holds unapplied ones (0 when caught up). Re-emissions wait RedueAfter plus this."),
		releasesPending: b.Gauge("releases_pending",
			"Releases of held items with parts left to apply (retry_release_parts): those behind their owner wait there for the fallbacks of rows the owner did not close."),
		busy: b.Counter("busy_total",
			"Facts handed back (redelivered after 5s) because another transaction held their item: a peer instance mid-batch, or frozen."),
		inProgress: b.Counter("in_progress_acks_total",
			"In-progress acks sent for facts held longer than a quarter of the ack wait (a slow batch), so that the short ack wait redelivers only a dead instance's facts."),
	}
	if err := b.Err(); err != nil {
		return nil, err
	}
	return m, nil
}

// exhaustedRow counts an exhausted row by its last error's class and the
// reason; outcome counts it by kind.
func (m *metrics) exhaustedRow(r *retrystore.Retry) {
	class := r.LastErrorClass
	if class == "" {
		class = "none"
	}
	m.exhaustedBy.WithLabelValues(r.Kind, class, r.ExhaustedReason).Inc()
}

func (m *metrics) outcome(ev contract.Lifecycle, kind string) {
	var c *prometheus.CounterVec
	switch ev {
	case contract.Scheduled:
		c = m.scheduled
	case contract.Rescheduled:
		c = m.rescheduled
	case contract.Succeeded:
		c = m.succeeded
	case contract.Exhausted:
		c = m.exhausted
	case contract.Cancelled:
		c = m.cancelled
	default:
		return
	}
	c.WithLabelValues(kind).Inc()
}

// runMetricsLoop refreshes the gauges every MetricsInterval.
func (s *Scheduler) runMetricsLoop(ctx context.Context) {
	wait.Every(ctx, s.cfg.MetricsInterval, func() {
		if err := s.refreshGauges(ctx); err != nil && ctx.Err() == nil {
			s.log.Warn().Err(err).Msg("refresh metrics")
		}
	})
}

func (s *Scheduler) refreshGauges(ctx context.Context) error {
	counts, err := retrystore.Pending(ctx, s.cfg.Pool)
	if err != nil {
		return err
	}
	// Reset so a kind with nothing pending reads 0 rather than its last
	// value.
	s.metrics.pending.Reset()
	for _, c := range counts {
		s.metrics.pending.WithLabelValues(c.Kind, string(c.State)).Set(float64(c.Count))
	}
	var n int64
	var lag float64
	err = s.cfg.Pool.QueryRow(ctx, `SELECT count(*), coalesce(extract(epoch FROM now() - min(created_at)), 0)::float8
FROM outbox WHERE owner = $1`, Owner).Scan(&n, &lag)
	if err != nil {
		return fmt.Errorf("read outbox lag: %w", err)
	}
	s.metrics.outboxPending.Set(float64(n))
	s.metrics.outboxLag.Set(lag)
	if err := s.cfg.Pool.QueryRow(ctx, `SELECT count(*) FROM retry_release_parts`).Scan(&n); err != nil {
		return fmt.Errorf("read releases pending: %w", err)
	}
	s.metrics.releasesPending.Set(float64(n))
	return nil
}
