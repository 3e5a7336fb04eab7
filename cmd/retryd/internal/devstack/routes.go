package devstack

import (
	"github.com/retryd/retryd/internal/auth"
	"net/http"

	"github.com/retryd/retryd/internal/dashboard"
	"github.com/retryd/retryd/internal/serve"
	"github.com/retryd/retryd/services/ingress"
	"github.com/retryd/retryd/services/jobs"
	"github.com/retryd/retryd/services/scheduler"
	"github.com/retryd/retryd/services/triggers"
)

// routes mounts every service's API on one mux, as a gateway in front of
// the separate services would: each service's routes go to its handler.
func (s *Stack) routes() http.Handler {
	mux := serve.NewMux(s.Registry, s.Health)
	mount := func(h http.Handler, prefixes ...string) {
		for _, p := range prefixes {
			mux.Handle(p, h)
		}
	}
	mount(s.Scheduler.Handler(), "/v1/retries", "/v1/retries/", "/v1/policies", "/v1/policies/")
	mount(s.Ingress.Handler(), "/v1/events", "/v1/events/", "/v1/events:batch", "/v1/sources", "/v1/sources/")
	mount(s.Triggers.Handler(), "/v1/triggers", "/v1/triggers/", "/v1/deliveries/", "/v1/runs", "/v1/runs/")
	s.JobsAPI.Register(mux)
	auth.NewAPI(s.tokens).Register(mux)
	mux.Handle(serve.IndexPath, serve.IndexHandler(scheduler.Routes(), ingress.Routes(), triggers.Routes(), jobs.Routes(), auth.Routes()))
	mux.HandleFunc("/v1/", func(w http.ResponseWriter, r *http.Request) {
		serve.WriteJSON(w, http.StatusNotFound, serve.ErrorBody{Error: serve.ErrorDetail{
			Code: serve.CodeNotFound, Message: "no API route " + r.Method + " " + r.URL.Path,
		}})
	})
	mux.Handle("/ui/", http.StripPrefix("/ui", dashboard.Handler(dashboard.Config{Summary: s.Summary})))
	mux.Handle("GET /{$}", http.RedirectHandler("/ui/", http.StatusFound))
	return mux
}
