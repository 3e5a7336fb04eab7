package jobs

import (
	"github.com/prometheus/client_golang/prometheus"

	"github.com/retryd/retryd/internal/promreg"
)

type projectorMetrics struct {
	applied    *prometheus.CounterVec // stream
	duplicates *prometheus.CounterVec // stream
	malformed  *prometheus.CounterVec // consumer (stream)
	errors     *prometheus.CounterVec // stream
}

func newProjectorMetrics(reg prometheus.Registerer) (*projectorMetrics, error) {
	m := &projectorMetrics{
		applied: prometheus.NewCounterVec(prometheus.CounterOpts{
			Namespace: "retryd", Subsystem: "jobs", Name: "applied_total",
			Help: "Messages folded into the jobs table, by stream.",
		}, []string{"stream"}),
		duplicates: prometheus.NewCounterVec(prometheus.CounterOpts{
			Namespace: "retryd", Subsystem: "jobs", Name: "duplicates_total",
			Help: "Messages already applied (inbox), by stream.",
		}, []string{"stream"}),
		malformed: prometheus.NewCounterVec(prometheus.CounterOpts{
			Namespace: "retryd", Subsystem: "jobs", Name: "malformed_total",
			Help: "Messages terminated because they could not be decoded, by consumer stream.",
		}, []string{"consumer"}),
		errors: prometheus.NewCounterVec(prometheus.CounterOpts{
			Namespace: "retryd", Subsystem: "jobs", Name: "apply_errors_total",
			Help: "Batches rolled back and handed back for redelivery, by stream.",
		}, []string{"stream"}),
	}
	var err error
	for _, c := range []**prometheus.CounterVec{&m.applied, &m.duplicates, &m.malformed, &m.errors} {
		if *c, err = promreg.Register(reg, *c); err != nil {
			return nil, err
		}
	}
	return m, nil
}

type apiMetrics struct {
	bulkItems *prometheus.CounterVec // result
}

func newAPIMetrics(reg prometheus.Registerer) (*apiMetrics, error) {
	m := &apiMetrics{
		bulkItems: prometheus.NewCounterVec(prometheus.CounterOpts{
			Namespace: "retryd", Subsystem: "jobs", Name: "bulk_retry_items_total",
			Help: "Jobs handled by bulk retries, by result (released, skipped, failed).",
		}, []string{"result"}),
	}
	var err error
	if m.bulkItems, err = promreg.Register(reg, m.bulkItems); err != nil {
		return nil, err
	}
	return m, nil
}
