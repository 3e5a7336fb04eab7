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
	b := promreg.Builder{Reg: reg, Namespace: "retryd", Subsystem: "jobs"}
	m := &projectorMetrics{
		applied:    b.CounterVec("applied_total", "Messages folded into the jobs table, by stream.", "stream"),
		duplicates: b.CounterVec("duplicates_total", "Messages already applied (inbox), by stream.", "stream"),
		malformed:  b.CounterVec("malformed_total", "Messages terminated because they could not be decoded, by consumer stream.", "consumer"),
		errors:     b.CounterVec("apply_errors_total", "Batches rolled back and handed back for redelivery, by stream.", "stream"),
	}
	if err := b.Err(); err != nil {
		return nil, err
	}
	return m, nil
}

type apiMetrics struct {
	bulkItems *prometheus.CounterVec // result
}

func newAPIMetrics(reg prometheus.Registerer) (*apiMetrics, error) {
	b := promreg.Builder{Reg: reg, Namespace: "retryd", Subsystem: "jobs"}
	m := &apiMetrics{
		bulkItems: b.CounterVec("bulk_retry_items_total", "Jobs handled by bulk retries, by result (released, skipped, failed).", "result"),
	}
	if err := b.Err(); err != nil {
		return nil, err
	}
	return m, nil
}
