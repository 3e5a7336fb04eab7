// Package promreg registers Prometheus collectors so that several
// instances of a component can share one registry. The dev runner and the
// tests run several schedulers, outboxes or workers in one process, and
// Prometheus refuses to register the same metric twice.
package promreg

import (
	"errors"
	"fmt"

	"github.com/prometheus/client_golang/prometheus"
)

// Register registers c with reg and returns it, or returns the collector
// of the same type already registered under its name: two workers, relays
// or schedulers in one process then count into the same series. A nil reg
// registers nothing.
func Register[C prometheus.Collector](reg prometheus.Registerer, c C) (C, error) {
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

// Builder constructs the metrics of one component and registers each as
// it is built. It exists so that a component's metrics file states each
// metric once (its name, help and labels, under the namespace and
// subsystem the component names) instead of constructing it in one list
// and registering it in a second one that must be kept in step (the
// scheduler's second list once left a counter out). Every metric goes
// through Register, so instances sharing a registry count into the same
// series. The first registration error is kept for Err; a metric built
// after it is still usable, unregistered.
type Builder struct {
	Reg       prometheus.Registerer
	Namespace string
	Subsystem string

	err error
}

// Err returns the first error met registering the metrics built so far.
func (b *Builder) Err() error { return b.err }

// CounterVec builds and registers a counter with labels.
func (b *Builder) CounterVec(name, help string, labels ...string) *prometheus.CounterVec {
	return keep(b, prometheus.NewCounterVec(prometheus.CounterOpts(b.opts(name, help)), labels))
}

// Counter builds and registers a counter without labels.
func (b *Builder) Counter(name, help string) prometheus.Counter {
	return keep(b, prometheus.NewCounter(prometheus.CounterOpts(b.opts(name, help))))
}

// GaugeVec builds and registers a gauge with labels.
func (b *Builder) GaugeVec(name, help string, labels ...string) *prometheus.GaugeVec {
	return keep(b, prometheus.NewGaugeVec(prometheus.GaugeOpts(b.opts(name, help)), labels))
}

// Gauge builds and registers a gauge without labels.
func (b *Builder) Gauge(name, help string) prometheus.Gauge {
	return keep(b, prometheus.NewGauge(prometheus.GaugeOpts(b.opts(name, help))))
}

// Histogram builds and registers a histogram without labels.
func (b *Builder) Histogram(name, help string, buckets []float64) prometheus.Histogram {
	return keep(b, prometheus.NewHistogram(prometheus.HistogramOpts{
		Namespace: b.Namespace, Subsystem: b.Subsystem, Name: name, Help: help, Buckets: buckets,
	}))
}

// opts names a metric in b's namespace and subsystem.
func (b *Builder) opts(name, help string) prometheus.Opts {
	return prometheus.Opts{Namespace: b.Namespace, Subsystem: b.Subsystem, Name: name, Help: help}
}

// keep registers c for b, returning the collector to count into.
func keep[C prometheus.Collector](b *Builder, c C) C {
	got, err := Register(b.Reg, c)
	if err != nil && b.err == nil {
		b.err = err
	}
	return got
}
