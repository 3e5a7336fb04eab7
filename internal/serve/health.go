package serve

import (
	"context"
	"net/http"
	"sync/atomic"
	"time"

	"github.com/prometheus/client_golang/prometheus"
	"github.com/prometheus/client_golang/prometheus/collectors"
	"github.com/prometheus/client_golang/prometheus/promhttp"

	"github.com/retryd/retryd/internal/wait"
)

// Health holds the readiness of a service. The zero value is not ready.
// /healthz (liveness) is always 200 while the process serves HTTP; /readyz
// is 200 while SetReady(true) holds and every dependency Watch probes
// answered its last probe.
type Health struct {
	ready atomic.Bool
	// down lists the dependencies whose last probe failed.
	down atomic.Pointer[[]string]
}

// SetReady turns readiness on (after streams, consumers and pools are up)
// or off (first step of a graceful stop).
func (h *Health) SetReady(ready bool) { h.ready.Store(ready) }

// Ready reports whether the service is ready: SetReady(true) and no
// dependency down.
func (h *Health) Ready() bool { return h.ready.Load() && len(h.Down()) == 0 }

// Down lists the dependencies whose last probe failed.
func (h *Health) Down() []string {
	if d := h.down.Load(); d != nil {
		return *d
	}
	return nil
}

// Check is a dependency readiness needs; Probe returns nil while it is
// reachable.
type Check struct {
	Name  string
	Probe func(ctx context.Context) error
}

// DefaultProbeInterval is how often Watch probes: a lost dependency turns
// readiness off within about twice this.
const DefaultProbeInterval = time.Second

// Watch probes every check each interval, each probe bounded by the
// interval, until ctx is done, so /readyz turns false within about two
// intervals of losing Postgres or NATS and true again once they answer.
// It returns when ctx is done.
func (h *Health) Watch(ctx context.Context, interval time.Duration, checks ...Check) {
	if interval <= 0 {
		interval = DefaultProbeInterval
	}
	wait.Every(ctx, interval, func() {
		var down []string
		for _, c := range checks {
			pctx, cancel := context.WithTimeout(ctx, interval)
			if err := c.Probe(pctx); err != nil && ctx.Err() == nil {
				down = append(down, c.Name)
			}
			cancel()
		}
		h.down.Store(&down)
	})
}

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
			body := map[string]any{"status": "not_ready"}
			if down := h.Down(); len(down) > 0 {
				body["down"] = down
			}
			WriteJSON(w, http.StatusServiceUnavailable, body)
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
