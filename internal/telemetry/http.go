package telemetry

import (
	"net/http"

	"go.opentelemetry.io/contrib/instrumentation/net/http/otelhttp"
)

// Handler wraps h so every request gets a server span ("GET /v1/retries/{kind}/{id}":
// method and the mux pattern that matched) that continues a trace sent in
// the request's traceparent header; name is the operation recorded on it
// (the service). Health and metrics scrapes are not traced. Without
// tracing the spans are no-ops.
func Handler(h http.Handler, name string) http.Handler {
	return otelhttp.NewHandler(h, name,
		otelhttp.WithFilter(func(r *http.Request) bool {
			switch r.URL.Path {
			case "/healthz", "/readyz", "/metrics":
				return false
			}
			return true
		}),
	)
}
