package serve

import (
	"net/http"
	"sync/atomic"

	"github.com/prometheus/client_golang/prometheus"
	"github.com/prometheus/client_golang/prometheus/collectors"
	"github.com/prometheus/client_golang/prometheus/promhttp"
)

// Health holds the readiness of a service. The zero value is not ready.
// /healthz (liveness) is always 200 while the process serves HTTP; /readyz
// follows SetReady.
type Health struct {
	ready atomic.Bool
}

// SetReady turns readiness on (after streams, consumers and pools are up)
// or off (first step of a graceful stop).
func (h *Health) SetReady(ready bool) { h.ready.Store(ready) }

// Ready reports the readiness flag.
func (h *Health) Ready() bool { return h.ready.Load() }

// NewMux returns a mux with /healthz, /readyz and /metrics mounted; the
// service adds its own routes to it. A nil gatherer serves an empty
// registry, a nil h is never ready.
func NewMux(reg prometheus.Gatherer, h *Health) *http.ServeMux {
	if reg == nil {
		reg = prometheus.NewRegistry()
	}
	if h == nil {
		h = &Health{}
	}
	mux := http.NewServeMux()
	mux.HandleFunc("GET /healthz", func(w http.ResponseWriter, _ *http.Request) {
		WriteJSON(w, http.StatusOK, map[string]string{"status": "ok"})
	})
	mux.HandleFunc("GET /readyz", func(w http.ResponseWriter, _ *http.Request) {
		if !h.Ready() {
			WriteJSON(w, http.StatusServiceUnavailable, map[string]string{"status": "not_ready"})
			return
		}
		WriteJSON(w, http.StatusOK, map[string]string{"status": "ready"})
	})
	mux.Handle("GET /metrics", promhttp.HandlerFor(reg, promhttp.HandlerOpts{}))
	return mux
}

// NewRegistry returns a Prometheus registry with the Go runtime and
// process collectors, what every retryd binary serves on /metrics.
func NewRegistry() *prometheus.Registry {
	reg := prometheus.NewRegistry()
	reg.MustRegister(collectors.NewGoCollector(), collectors.NewProcessCollector(collectors.ProcessCollectorOpts{}))
	return reg
}
