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
	r := registrar{reg: reg}
	m := &metrics{
		attempts: keep(&r, prometheus.NewCounterVec(prometheus.CounterOpts{
			Namespace: "retryd", Subsystem: "worker", Name: "attempts_total",
			Help: "Job attempts run, by job type and outcome (succeeded, failed, held, panicked, timed_out, interrupted).",
		}, []string{"job_type", "outcome"})),
		duration: keep(&r, prometheus.NewHistogramVec(prometheus.HistogramOpts{
			Namespace: "retryd", Subsystem: "worker", Name: "attempt_duration_seconds",
			Help:    "How long handlers ran, by job type and outcome.",
			Buckets: prometheus.ExponentialBuckets(0.005, 4, 10),
		}, []string{"job_type", "outcome"})),
		inflight: keep(&r, prometheus.NewGaugeVec(prometheus.GaugeOpts{
			Namespace: "retryd", Subsystem: "worker", Name: "inflight",
			Help: "Handlers running now, by job type.",
		}, []string{"job_type"})),
		malformed: keep(&r, prometheus.NewCounterVec(prometheus.CounterOpts{
			Namespace: "retryd", Subsystem: "worker", Name: "malformed_total",
			Help: "Messages terminated because they could not be decoded, by consumer.",
		}, []string{"consumer"})),
		routed: keep(&r, prometheus.NewCounter(prometheus.CounterOpts{
			Namespace: "retryd", Subsystem: "worker", Name: "routed_total",
			Help: "Due events republished as jobs by the due router.",
		})),
		publishRetries: keep(&r, prometheus.NewCounterVec(prometheus.CounterOpts{
			Namespace: "retryd", Subsystem: "worker", Name: "publish_retries_total",
			Help: "Publishes of outcomes or routed jobs tried again after an error, by event.",
		}, []string{"event"})),
		recreated: keep(&r, prometheus.NewCounter(prometheus.CounterOpts{
			Namespace: "retryd", Subsystem: "worker", Name: "consumers_recreated_total",
			Help: "Durable consumers found deleted while the worker ran and created again.",
		})),
		replaySkipped: keep(&r, prometheus.NewCounter(prometheus.CounterOpts{
			Namespace: "retryd", Subsystem: "worker", Name: "replay_skipped_total",
			Help: "Jobs and dues a newly created consumer delivered again that already had an outcome, acked without running.",
		})),
		pending: keep(&r, prometheus.NewGauge(prometheus.GaugeOpts{
			Namespace: "retryd", Subsystem: "worker", Name: "pending_facts",
			Help: "Failed and held facts kept until the scheduler's decision is seen.",
		})),
		pendingEvicted: keep(&r, prometheus.NewCounter(prometheus.CounterOpts{
			Namespace: "retryd", Subsystem: "worker", Name: "pending_evicted_total",
			Help: "Kept facts dropped undecided because Config.PendingLimit was reached; a purge before the scheduler reads them loses them.",
		})),
		republished: keep(&r, prometheus.NewCounterVec(prometheus.CounterOpts{
			Namespace: "retryd", Subsystem: "worker", Name: "republished_total",
			Help: "Failed and held facts published again because they left RETRIES (a purge) before their decision, by event.",
		}, []string{"event"})),
	}
	if r.err != nil {
		return nil, r.err
	}
	return m, nil
}

// registrar registers the metrics as newMetrics builds them, so that each
// is stated once. After the first error it registers nothing more and
// keeps that error.
type registrar struct {
	reg prometheus.Registerer
	err error
}

// keep registers c with r's registry and returns the collector to count
// into: c, or the one of its name already registered.
func keep[C prometheus.Collector](r *registrar, c C) C {
	if r.err != nil {
		return c
	}
	got, err := register(r.reg, c)
	if err != nil {
		r.err = err
	}
	return got
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
