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
