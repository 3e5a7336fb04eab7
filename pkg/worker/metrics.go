package worker

import (
	"errors"
	"fmt"

	"github.com/prometheus/client_golang/prometheus"
)

type metrics struct {
	attempts       *prometheus.CounterVec   // job_type, outcome
	duration       *prometheus.HistogramVec // job_type, outcome
	inflight       *prometheus.GaugeVec     // job_type
	malformed      *prometheus.CounterVec   // consumer
	routed         prometheus.Counter
	publishRetries *prometheus.CounterVec // event
	recreated      prometheus.Counter
	replaySkipped  prometheus.Counter
	pending        prometheus.Gauge
	pendingEvicted prometheus.Counter
	republished    *prometheus.CounterVec // event
}

// Values of the outcome label.
const (
	outcomeSucceeded   = "succeeded"
	outcomeFailed      = "failed"
	outcomeHeld        = "held"
	outcomePanicked    = "panicked"
	outcomeTimedOut    = "timed_out"
	outcomeInterrupted = "interrupted"
)

func newMetrics(reg prometheus.Registerer) (*metrics, error) {
	m := &metrics{
		attempts: prometheus.NewCounterVec(prometheus.CounterOpts{
			Namespace: "retryd", Subsystem: "worker", Name: "attempts_total",
			Help: "Job attempts run, by job type and outcome (succeeded, failed, held, panicked, timed_out, interrupted).",
		}, []string{"job_type", "outcome"}),
		duration: prometheus.NewHistogramVec(prometheus.HistogramOpts{
			Namespace: "retryd", Subsystem: "worker", Name: "attempt_duration_seconds",
			Help:    "How long handlers ran, by job type and outcome.",
			Buckets: prometheus.ExponentialBuckets(0.005, 4, 10),
		}, []string{"job_type", "outcome"}),
		inflight: prometheus.NewGaugeVec(prometheus.GaugeOpts{
			Namespace: "retryd", Subsystem: "worker", Name: "inflight",
			Help: "Handlers running now, by job type.",
		}, []string{"job_type"}),
		malformed: prometheus.NewCounterVec(prometheus.CounterOpts{
			Namespace: "retryd", Subsystem: "worker", Name: "malformed_total",
			Help: "Messages terminated because they could not be decoded, by consumer.",
		}, []string{"consumer"}),
		routed: prometheus.NewCounter(prometheus.CounterOpts{
			Namespace: "retryd", Subsystem: "worker", Name: "routed_total",
			Help: "Due events republished as jobs by the due router.",
		}),
		publishRetries: prometheus.NewCounterVec(prometheus.CounterOpts{
			Namespace: "retryd", Subsystem: "worker", Name: "publish_retries_total",
			Help: "Publishes of outcomes or routed jobs tried again after an error, by event.",
		}, []string{"event"}),
		recreated: prometheus.NewCounter(prometheus.CounterOpts{
			Namespace: "retryd", Subsystem: "worker", Name: "consumers_recreated_total",
			Help: "Durable consumers found deleted while the worker ran and created again.",
		}),
		replaySkipped: prometheus.NewCounter(prometheus.CounterOpts{
			Namespace: "retryd", Subsystem: "worker", Name: "replay_skipped_total",
			Help: "Jobs and dues a newly created consumer delivered again that already had an outcome, acked without running.",
		}),
		pending: prometheus.NewGauge(prometheus.GaugeOpts{
			Namespace: "retryd", Subsystem: "worker", Name: "pending_facts",
			Help: "Failed and held facts kept until the scheduler's decision is seen.",
		}),
		pendingEvicted: prometheus.NewCounter(prometheus.CounterOpts{
			Namespace: "retryd", Subsystem: "worker", Name: "pending_evicted_total",
			Help: "Kept facts dropped undecided because Config.PendingLimit was reached; a purge before the scheduler reads them loses them.",
		}),
		republished: prometheus.NewCounterVec(prometheus.CounterOpts{
			Namespace: "retryd", Subsystem: "worker", Name: "republished_total",
			Help: "Failed and held facts published again because they left RETRIES (a purge) before their decision, by event.",
		}, []string{"event"}),
	}
	var err error
	m.attempts, err = register(reg, m.attempts)
	if err != nil {
		return nil, err
	}
	m.duration, err = register(reg, m.duration)
	if err != nil {
		return nil, err
	}
	m.inflight, err = register(reg, m.inflight)
	if err != nil {
		return nil, err
	}
	m.malformed, err = register(reg, m.malformed)
	if err != nil {
		return nil, err
	}
	m.routed, err = register(reg, m.routed)
	if err != nil {
		return nil, err
	}
	m.publishRetries, err = register(reg, m.publishRetries)
	if err != nil {
		return nil, err
	}
	m.recreated, err = register(reg, m.recreated)
	if err != nil {
		return nil, err
	}
	m.replaySkipped, err = register(reg, m.replaySkipped)
	if err != nil {
		return nil, err
	}
	m.pending, err = register(reg, m.pending)
	if err != nil {
		return nil, err
	}
	m.pendingEvicted, err = register(reg, m.pendingEvicted)
	if err != nil {
		return nil, err
	}
	m.republished, err = register(reg, m.republished)
	if err != nil {
		return nil, err
	}
	return m, nil
}

// register registers c with reg, or returns the collector of the same type
// already registered under its name, so that several workers in one
// process count into the same series. It repeats the services' internal
// promreg.Register on purpose: the SDK module does not import retryd's
// internal packages (see CONTRIBUTING.md, deliberate duplicates).
func register[C prometheus.Collector](reg prometheus.Registerer, c C) (C, error) {
	if reg == nil {
		return c, nil
	}
	err := reg.Register(c)
	if err == nil {
		return c, nil
	}
	var are prometheus.AlreadyRegisteredError
	if errors.As(err, &are) {
		if existing, ok := are.ExistingCollector.(C); ok {
			return existing, nil
		}
	}
	return c, fmt.Errorf("register metric: %w", err)
}
