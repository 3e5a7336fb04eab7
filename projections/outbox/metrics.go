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
	m := &metrics{}
	var err error
	if m.published, err = promreg.Register(reg, counter("published_total",
		"Outbox messages published and acknowledged by JetStream (duplicates included).")); err != nil {
		return nil, err
	}
	if m.duplicates, err = promreg.Register(reg, counter("duplicates_total",
		"Outbox messages JetStream acknowledged as duplicates (published before, e.g. by a relay that stopped before deleting them).")); err != nil {
		return nil, err
	}
	if m.errors, err = promreg.Register(reg, counter("publish_errors_total",
		"Outbox message publishes that failed; the rows stay in the outbox and are retried.")); err != nil {
		return nil, err
	}
	if m.pending, err = promreg.Register(reg, gauge("pending",
		"Outbox rows waiting to be published.")); err != nil {
		return nil, err
	}
	if m.lag, err = promreg.Register(reg, gauge("lag_seconds",
		"Age of the oldest outbox row waiting to be published.")); err != nil {
		return nil, err
	}
	return m, nil
}

func counter(name, help string) *prometheus.CounterVec {
	return prometheus.NewCounterVec(prometheus.CounterOpts{
		Namespace: "retryd", Subsystem: "outbox", Name: name, Help: help,
	}, []string{"owner"})
}

func gauge(name, help string) *prometheus.GaugeVec {
	return prometheus.NewGaugeVec(prometheus.GaugeOpts{
		Namespace: "retryd", Subsystem: "outbox", Name: name, Help: help,
	}, []string{"owner"})
}
