package outbox

import (
	"github.com/prometheus/client_golang/prometheus"

	"github.com/retryd/retryd/internal/promreg"
)

type metrics struct {
	published  *prometheus.CounterVec
	duplicates *prometheus.CounterVec
	errors     *prometheus.CounterVec
	pending    *prometheus.GaugeVec
	lag        *prometheus.GaugeVec
}

// newMetrics registers the relay metrics on reg. Several relays (one per
// service in the dev runner) share one registry: a collector that is
// already registered is reused, and the owner label tells them apart.
func newMetrics(reg prometheus.Registerer) (*metrics, error) {
	b := promreg.Builder{Reg: reg, Namespace: "retryd", Subsystem: "outbox"}
	m := &metrics{
		published: b.CounterVec("published_total",
			"Outbox messages published and acknowledged by JetStream (duplicates included).", "owner"),
		duplicates: b.CounterVec("duplicates_total",
			"Outbox messages JetStream acknowledged as duplicates (published before, e.g. by a relay that stopped before deleting them).", "owner"),
		errors: b.CounterVec("publish_errors_total",
			"Outbox message publishes that failed; the rows stay in the outbox and are retried.", "owner"),
		pending: b.GaugeVec("pending",
			"Outbox rows waiting to be published.", "owner"),
		lag: b.GaugeVec("lag_seconds",
			"Age of the oldest outbox row waiting to be published.", "owner"),
	}
	if err := b.Err(); err != nil {
		return nil, err
	}
	return m, nil
}
