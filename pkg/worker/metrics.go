package worker

import (
	"github.com/prometheus/client_golang/prometheus"

	"github.com/retryd/retryd/pkg/internal/metricreg"
)

// metrics are the worker's own series; the reporter's (pending facts,
// republishes, publish retries) are owner.ReporterMetrics under the
// "worker" subsystem.
type metrics struct {
	attempts      *prometheus.CounterVec   // job_type, outcome
	duration      *prometheus.HistogramVec // job_type, outcome
	inflight      *prometheus.GaugeVec     // job_type
	malformed     *prometheus.CounterVec   // consumer
	routed        prometheus.Counter
	recreated     prometheus.Counter
	replaySkipped prometheus.Counter
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
	r := metricreg.Registrar{Reg: reg}
	m := &metrics{
		attempts: metricreg.Keep(&r, prometheus.NewCounterVec(prometheus.CounterOpts{
			Namespace: "retryd", Subsystem: "worker", Name: "attempts_total",
			Help: "Job attempts run, by job type and outcome (succeeded, failed, held, panicked, timed_out, interrupted).",
		}, []string{"job_type", "outcome"})),
		duration: metricreg.Keep(&r, prometheus.NewHistogramVec(prometheus.HistogramOpts{
			Namespace: "retryd", Subsystem: "worker", Name: "attempt_duration_seconds",
			Help:    "How long handlers ran, by job type and outcome.",
			Buckets: prometheus.ExponentialBuckets(0.005, 4, 10),
		}, []string{"job_type", "outcome"})),
		inflight: metricreg.Keep(&r, prometheus.NewGaugeVec(prometheus.GaugeOpts{
			Namespace: "retryd", Subsystem: "worker", Name: "inflight",
			Help: "Handlers running now, by job type.",
		}, []string{"job_type"})),
		malformed: metricreg.Keep(&r, prometheus.NewCounterVec(prometheus.CounterOpts{
			Namespace: "retryd", Subsystem: "worker", Name: "malformed_total",
			Help: "Messages terminated because they could not be decoded, by consumer.",
		}, []string{"consumer"})),
		routed: metricreg.Keep(&r, prometheus.NewCounter(prometheus.CounterOpts{
			Namespace: "retryd", Subsystem: "worker", Name: "routed_total",
			Help: "Due events republished as jobs by the due router.",
		})),
		recreated: metricreg.Keep(&r, prometheus.NewCounter(prometheus.CounterOpts{
			Namespace: "retryd", Subsystem: "worker", Name: "consumers_recreated_total",
			Help: "Durable consumers found deleted while the worker ran and created again.",
		})),
		replaySkipped: metricreg.Keep(&r, prometheus.NewCounter(prometheus.CounterOpts{
			Namespace: "retryd", Subsystem: "worker", Name: "replay_skipped_total",
			Help: "Jobs and dues a newly created consumer delivered again that already had an outcome, acked without running.",
		})),
	}
	if r.Err != nil {
		return nil, r.Err
	}
	return m, nil
}
