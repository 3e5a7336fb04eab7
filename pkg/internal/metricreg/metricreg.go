// Package metricreg registers the SDK's metrics so that several workers or
// owners in one process count into the same series. It repeats the
// services' internal/promreg on purpose: the SDK module imports nothing of
// the server module (see CONTRIBUTING.md, deliberate duplicates).
package metricreg

import (
	"errors"
	"fmt"

	"github.com/prometheus/client_golang/prometheus"
)

// Registrar registers metrics as a constructor builds them, so that each
// is stated once. After the first error it registers nothing more and
// keeps that error in Err.
type Registrar struct {
	Reg prometheus.Registerer
	Err error
}

// Keep registers c with r's registry and returns the collector to count
// into: c, or the one of its name already registered.
func Keep[C prometheus.Collector](r *Registrar, c C) C {
	if r.Err != nil {
		return c
	}
	got, err := Register(r.Reg, c)
	if err != nil {
		r.Err = err
	}
	return got
}

// Register registers c with reg, or returns the collector of the same type
// already registered under its name. A nil reg registers nothing.
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
