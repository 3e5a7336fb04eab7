package ingress

import (
	"sync"

	"github.com/prometheus/client_golang/prometheus"

	"github.com/retryd/retryd/internal/promreg"
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
	b := promreg.Builder{Reg: reg, Namespace: "retryd", Subsystem: "ingress"}
	m := &metrics{
		intake: b.CounterVec("intake_total",
			"Events offered over HTTP by result: accepted, duplicate (id already in INGEST), rejected (bad input: 400/413), failed (not stored in INGEST: 503).",
			"source", "result"),
		intakeLatency: b.Histogram("intake_duration_seconds",
			"Time from request to response of POST /v1/events, PubAck included.",
			[]float64{.0005, .001, .002, .005, .01, .025, .05, .1, .25, .5, 1, 2.5}),
		gate: b.CounterVec("gate_total",
			"Events from INGEST by decision: admitted, deferred, duplicate (id already stored), rejected (type not allowed).",
			"source", "decision"),
		deferrals: b.CounterVec("deferrals_total",
			"Gate rejections that became failed events, first ones and retries alike, by reason.",
			"source", "reason"),
		retries: b.CounterVec("retries_total",
			"Event-ingress retry lifecycle per source: scheduled, rescheduled, due, waited (a throttled event's due handed back until its turn), completed (admitted on a retry), cancelled, exhausted.",
			"source", "event"),
		malformed: b.CounterVec("malformed_total",
			"Messages terminated because they cannot be processed, by consumer.",
			"consumer"),
		reconciled: b.Counter("reconciled_total",
			"Failed events published again for deferrals the scheduler had not confirmed."),
		rateLimited: b.Counter("intake_rate_limited_total",
			"Intake requests refused with 429 because their caller (token) sent more than RETRYD_INTAKE_RATE allows."),
		sources: &sourceLabels{max: maxSources, seen: map[string]struct{}{}},
	}
	if err := b.Err(); err != nil {
		return nil, err
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
