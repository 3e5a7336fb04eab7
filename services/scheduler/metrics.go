package scheduler

import (
	"context"
	"fmt"
	"time"

	"github.com/prometheus/client_golang/prometheus"

	"github.com/retryd/retryd/internal/promreg"
	"github.com/retryd/retryd/pkg/contract"
	"github.com/retryd/retryd/projections/retrystore"
)

type metrics struct {
	scheduled, rescheduled, due, succeeded, exhausted, cancelled *prometheus.CounterVec

	redue, dueDuplicates *prometheus.CounterVec
	lateness             prometheus.Histogram
	pending              *prometheus.GaugeVec
	outboxPending        prometheus.Gauge
	outboxLag            prometheus.Gauge
	policyLag            prometheus.Gauge
	busy                 prometheus.Counter
	inProgress           prometheus.Counter

	malformed, duplicate, stale, errors *prometheus.CounterVec
}

// latenessBuckets run from 1ms to 60s.
var latenessBuckets = []float64{0.001, 0.0025, 0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1, 2.5, 5, 10, 30, 60}

func newMetrics(reg prometheus.Registerer) (*metrics, error) {
	counter := func(name, help string, labels ...string) *prometheus.CounterVec {
		return prometheus.NewCounterVec(prometheus.CounterOpts{Namespace: "retryd", Subsystem: "scheduler", Name: name, Help: help}, labels)
	}
	m := &metrics{
		scheduled:     counter("scheduled_total", "First retries scheduled.", "kind"),
		rescheduled:   counter("rescheduled_total", "Later retries scheduled, manual retries included.", "kind"),
		due:           counter("due_total", "Due events emitted (stored by JetStream for the first time).", "kind"),
		succeeded:     counter("succeeded_total", "Retried items that succeeded.", "kind"),
		exhausted:     counter("exhausted_total", "Items exhausted (dead-lettered).", "kind"),
		cancelled:     counter("cancelled_total", "Items cancelled.", "kind"),
		redue:         counter("redue_total", "Due events emitted again because the owner reported no outcome within RedueAfter.", "kind"),
		dueDuplicates: counter("due_duplicates_total", "Due publishes JetStream absorbed as duplicates of an earlier publish (same Nats-Msg-Id).", "kind"),
		lateness: prometheus.NewHistogram(prometheus.HistogramOpts{
			Namespace: "retryd", Subsystem: "scheduler", Name: "due_lateness_seconds",
			Help:    "Time from next_attempt_at to the publish of the due event, by the database clock.",
			Buckets: latenessBuckets,
		}),
		pending: prometheus.NewGaugeVec(prometheus.GaugeOpts{
			Namespace: "retryd", Subsystem: "scheduler", Name: "pending",
			Help: "Retries waiting (state scheduled) or out for an outcome (state due).",
		}, []string{"kind", "state"}),
		outboxPending: prometheus.NewGauge(prometheus.GaugeOpts{
			Namespace: "retryd", Subsystem: "scheduler", Name: "outbox_pending",
			Help: "Lifecycle events in the scheduler's outbox not yet published.",
		}),
		outboxLag: prometheus.NewGauge(prometheus.GaugeOpts{
			Namespace: "retryd", Subsystem: "scheduler", Name: "outbox_lag_seconds",
			Help: "Age of the oldest unpublished event in the scheduler's outbox (0 when empty).",
		}),
		policyLag: prometheus.NewGauge(prometheus.GaugeOpts{
			Namespace: "retryd", Subsystem: "scheduler", Name: "policy_lag_seconds",
			Help: "How far the policy stage is behind RETRIES: the age of the newest applied fact while the consumer holds unapplied ones (0 when caught up). Re-emissions wait RedueAfter plus this.",
		}),
		busy: prometheus.NewCounter(prometheus.CounterOpts{
			Namespace: "retryd", Subsystem: "scheduler", Name: "busy_total",
			Help: "Facts handed back (redelivered after 5s) because another transaction held their item: a peer instance mid-batch, or frozen.",
		}),
		inProgress: prometheus.NewCounter(prometheus.CounterOpts{
			Namespace: "retryd", Subsystem: "scheduler", Name: "in_progress_acks_total",
			Help: "In-progress acks sent for facts held longer than a quarter of the ack wait (a slow batch), so that the short ack wait redelivers only a dead instance's facts.",
		}),
		malformed: counter("malformed_total", "Messages terminated because they could not be decoded.", "consumer"),
		duplicate: counter("duplicate_total", "Messages already applied (inbox hit), acked without effect.", "consumer"),
		stale:     counter("stale_total", "Facts ignored because the row moved past them (old attempt or terminal state).", "kind", "event"),
		errors:    counter("errors_total", "Failed transactions or publishes by stage (retried).", "stage"),
	}
	cs := []prometheus.Collector{
		m.scheduled, m.rescheduled, m.due, m.succeeded, m.exhausted, m.cancelled, m.redue, m.dueDuplicates,
		m.lateness, m.pending, m.outboxPending, m.outboxLag, m.malformed, m.duplicate, m.stale, m.errors, m.policyLag, m.busy, m.inProgress,
	}
	for i, c := range cs {
		got, err := promreg.Register(reg, c)
		if err != nil {
			return nil, err
		}
		cs[i] = got
	}
	// Several schedulers on one registry (the dev runner, tests) share the
	// collectors registered first.
	m.scheduled, m.rescheduled, m.due, m.succeeded = cs[0].(*prometheus.CounterVec), cs[1].(*prometheus.CounterVec), cs[2].(*prometheus.CounterVec), cs[3].(*prometheus.CounterVec)
	m.exhausted, m.cancelled, m.redue, m.dueDuplicates = cs[4].(*prometheus.CounterVec), cs[5].(*prometheus.CounterVec), cs[6].(*prometheus.CounterVec), cs[7].(*prometheus.CounterVec)
	m.lateness, m.pending, m.outboxPending, m.outboxLag = cs[8].(prometheus.Histogram), cs[9].(*prometheus.GaugeVec), cs[10].(prometheus.Gauge), cs[11].(prometheus.Gauge)
	m.malformed, m.duplicate, m.stale, m.errors = cs[12].(*prometheus.CounterVec), cs[13].(*prometheus.CounterVec), cs[14].(*prometheus.CounterVec), cs[15].(*prometheus.CounterVec)
	m.policyLag, m.busy = cs[16].(prometheus.Gauge), cs[17].(prometheus.Counter)
	return m, nil
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
	t := time.NewTicker(s.cfg.MetricsInterval)
	defer t.Stop()
	for {
		if err := s.refreshGauges(ctx); err != nil && ctx.Err() == nil {
			s.log.Warn().Err(err).Msg("refresh metrics")
		}
		select {
		case <-ctx.Done():
			return
		case <-t.C:
		}
	}
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
	return nil
}
