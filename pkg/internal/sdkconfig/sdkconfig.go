// Package sdkconfig fills the defaults every SDK component's Config shares
// (the worker's, the owner's), so that they are stated once.
package sdkconfig

import (
	"log/slog"
	"time"

	"github.com/prometheus/client_golang/prometheus"

	"github.com/retryd/retryd/pkg/errclass"
)

// Fill sets what is nil: the default classifier, a private metrics
// registry, a logger that discards (a library writes to the program's
// log only when asked to) and the wall clock.
func Fill(classifier **errclass.Classifier, reg *prometheus.Registerer, log **slog.Logger, now *func() time.Time) {
	if *classifier == nil {
		*classifier = errclass.DefaultClassifier()
	}
	if *reg == nil {
		*reg = prometheus.NewRegistry()
	}
	if *log == nil {
		*log = slog.New(slog.DiscardHandler)
	}
	if *now == nil {
		*now = time.Now
	}
}
