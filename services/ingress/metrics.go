package ingress

import (
	"sync"

	"github.com/prometheus/client_golang/prometheus"
)

// Values of the labels on ingress metrics.
const (
	resultAccepted  = "accepted"
	resultDuplicate = "duplicate"
	resultRejected  = "rejected"
	resultFailed    = "failed"

	decisionAdmitted  = "admitted"
	decisionDeferred  = "deferred"
	decisionDuplicate = "duplicate"
	decisionRejected  = "rejected"

	retryScheduled   = "scheduled"
	retryRescheduled = "rescheduled"
	retryDue         = "due"
	retryWaited      = "waited"
	retryCompleted   = "completed"
	retryCancelled   = "cancelled"
	retryExhausted   = "exhausted"

	otherSource = "_other"
)

type metrics struct {
	intake        *prometheus.CounterVec
	intakeLatency prometheus.Histogram
	gate          *prometheus.CounterVec
	deferrals     *prometheus.CounterVec
	retries       *prometheus.CounterVec
	malformed     *prometheus.CounterVec
	reconciled    prometheus.Counter
	rateLimited   prometheus.Counter

	sources *sourceLabels
}

func newMetrics(reg prometheus.Registerer, maxSources int) (*metrics, error) {
	const ns, sub = "retryd", "ingress"
	m := &metrics{
		intake: prometheus.NewCounterVec(prometheus.CounterOpts{
			Namespace: ns, Subsystem: sub, Name: "intake_total",
			Help: "Events offered over HTTP by result: accepted, duplicate (id already in INGEST), rejected (bad input: 400/413), failed (not stored in INGEST: 503).",
		}, []string{"source", "result"}),
		intakeLatency: prometheus.NewHistogram(prometheus.HistogramOpts{
			Namespace: ns, Subsystem: sub, Name: "intake_duration_seconds",
			Help:    "Time from request to response of POST /v1/events, PubAck included.",
			Buckets: []float64{.0005, .001, .002, .005, .01, .025, .05, .1, .25, .5, 1, 2.5},
		}),
		gate: prometheus.NewCounterVec(prometheus.CounterOpts{
			Namespace: ns, Subsystem: sub, Name: "gate_total",
			Help: "Events from INGEST by decision: admitted, deferred, duplicate (id already stored), rejected (type not allowed).",
		}, []string{"source", "decision"}),
		deferrals: prometheus.NewCounterVec(prometheus.CounterOpts{
			Namespace: ns, Subsystem: sub, Name: "deferrals_total",
			Help: "Gate rejections that became failed events, first ones and retries alike, by reason.",
		}, []string{"source", "reason"}),
		retries: prometheus.NewCounterVec(prometheus.CounterOpts{
			Namespace: ns, Subsystem: sub, Name: "retries_total",
			Help: "Event-ingress retry lifecycle per source: scheduled, rescheduled, due, waited (a throttled event's due handed back until its turn), completed (admitted on a retry), cancelled, exhausted.",
		}, []string{"source", "event"}),
		malformed: prometheus.NewCounterVec(prometheus.CounterOpts{
			Namespace: ns, Subsystem: sub, Name: "malformed_total",
			Help: "Messages terminated because they cannot be processed, by consumer.",
		}, []string{"consumer"}),
		reconciled: prometheus.NewCounter(prometheus.CounterOpts{
			Namespace: ns, Subsystem: sub, Name: "reconciled_total",
			Help: "Failed events published again for deferrals the scheduler had not confirmed.",
		}),
		rateLimited: prometheus.NewCounter(prometheus.CounterOpts{
			Namespace: ns, Subsystem: sub, Name: "intake_rate_limited_total",
			Help: "Intake requests refused with 429 because their caller (token) sent more than RETRYD_INTAKE_RATE allows.",
		}),
		sources: &sourceLabels{max: maxSources, seen: map[string]struct{}{}},
	}
	for _, c := range []prometheus.Collector{m.intake, m.intakeLatency, m.gate, m.deferrals, m.retries, m.malformed, m.reconciled, m.rateLimited} {
		if err := reg.Register(c); err != nil {
			return nil, err
		}
	}
	for _, c := range []string{ConsumerGate, ConsumerRetry, ConsumerRetryState} {
		m.malformed.WithLabelValues(c)
	}
	return m, nil
}

func (m *metrics) retry(source, event string) {
	m.retries.WithLabelValues(m.sources.label(source), event).Inc()
}

// sourceLabels keeps the source label's cardinality bounded: sources are
// named by producers.
type sourceLabels struct {
	mu   sync.Mutex
	max  int
	seen map[string]struct{}
}

func (s *sourceLabels) label(source string) string {
	s.mu.Lock()
	defer s.mu.Unlock()
	if _, ok := s.seen[source]; ok {
		return source
	}
	if len(s.seen) >= s.max {
		return otherSource
	}
	s.seen[source] = struct{}{}
	return source
}
