package owner

import (
	"github.com/prometheus/client_golang/prometheus"

	"github.com/retryd/retryd/pkg/internal/metricreg"
)

// ReporterMetrics are a Reporter's series: retryd_<subsystem>_... with
// subsystem "worker" for the worker SDK and "owner" for an Owner.
type ReporterMetrics struct {
	Pending        prometheus.Gauge
	Evicted        prometheus.Counter
	Republished    *prometheus.CounterVec // event
	PublishRetries *prometheus.CounterVec // event
}

// NewReporterMetrics registers a Reporter's series with reg under
// subsystem; series already registered by another reporter are shared.
func NewReporterMetrics(reg prometheus.Registerer, subsystem string) (*ReporterMetrics, error) {
	r := metricreg.Registrar{Reg: reg}
	m := &ReporterMetrics{
		Pending: metricreg.Keep(&r, prometheus.NewGauge(prometheus.GaugeOpts{
			Namespace: "retryd", Subsystem: subsystem, Name: "pending_facts",
			Help: "Failed and held facts kept until the scheduler's decision is seen.",
		})),
		Evicted: metricreg.Keep(&r, prometheus.NewCounter(prometheus.CounterOpts{
			Namespace: "retryd", Subsystem: subsystem, Name: "pending_evicted_total",
			Help: "Kept facts dropped undecided because Config.PendingLimit was reached; a purge before the scheduler reads them loses them.",
		})),
		Republished: metricreg.Keep(&r, prometheus.NewCounterVec(prometheus.CounterOpts{
			Namespace: "retryd", Subsystem: subsystem, Name: "republished_total",
			Help: "Failed and held facts published again because they left RETRIES (a purge) before their decision, by event.",
		}, []string{"event"})),
		PublishRetries: metricreg.Keep(&r, prometheus.NewCounterVec(prometheus.CounterOpts{
			Namespace: "retryd", Subsystem: subsystem, Name: "publish_retries_total",
			Help: "Publishes of outcomes or routed jobs tried again after an error, by event.",
		}, []string{"event"})),
	}
	if r.Err != nil {
		return nil, r.Err
	}
	return m, nil
}

// ownerMetrics are an Owner's own series, by kind.
type ownerMetrics struct {
	attempts  *prometheus.CounterVec   // kind, outcome
	duration  *prometheus.HistogramVec // kind, outcome
	malformed *prometheus.CounterVec   // kind
}

func newOwnerMetrics(reg prometheus.Registerer) (*ownerMetrics, error) {
	r := metricreg.Registrar{Reg: reg}
	m := &ownerMetrics{
		attempts: metricreg.Keep(&r, prometheus.NewCounterVec(prometheus.CounterOpts{
			Namespace: "retryd", Subsystem: "owner", Name: "attempts_total",
			Help: "Attempts an owner ran, by kind and outcome (succeeded, failed, held, panicked).",
		}, []string{"kind", "outcome"})),
		duration: metricreg.Keep(&r, prometheus.NewHistogramVec(prometheus.HistogramOpts{
			Namespace: "retryd", Subsystem: "owner", Name: "attempt_duration_seconds",
			Help:    "How long an owner's handler ran, by kind and outcome.",
			Buckets: prometheus.ExponentialBuckets(0.005, 4, 10),
		}, []string{"kind", "outcome"})),
		malformed: metricreg.Keep(&r, prometheus.NewCounterVec(prometheus.CounterOpts{
			Namespace: "retryd", Subsystem: "owner", Name: "malformed_total",
			Help: "Due events an owner terminated because they did not decode, by kind.",
		}, []string{"kind"})),
	}
	if r.Err != nil {
		return nil, r.Err
	}
	return m, nil
}
