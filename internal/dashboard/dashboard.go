// Package dashboard serves retryd's web dashboard: pending, due and
// exhausted retries with filters, one item's timeline ("why did it
// retry?"), job retry analytics, cancel / retry / pause actions and policy
// editing.
//
// It is static HTML, CSS and JavaScript embedded in the binary (no build
// step) that calls retryd's HTTP API from the browser. Any service can
// mount it:
//
//	mux.Handle("/ui/", http.StripPrefix("/ui", dashboard.Handler(dashboard.Config{})))
//
// The API routes it calls (/v1/retries, /v1/policies, /v1/sources,
// /v1/analytics/retries, /v1/jobs) are expected on the same origin, as
// `retryd dev` serves them, or under Config.APIBase (a gateway).
package dashboard

import (
	"bytes"
	"context"
	"embed"
	"html/template"
	"io/fs"
	"net/http"
	"net/url"
	"strings"
	"time"

	"github.com/retryd/retryd/internal/serve"
)

//go:embed static
var static embed.FS

// Config configures the dashboard.
type Config struct {
	// APIBase is the origin (and path prefix) of the retryd API, e.g.
	// "https://retryd.example.com"; empty means the dashboard's own origin.
	APIBase string
	// Title is shown in the header and the window title. Default "retryd".
	Title string
	// Refresh is how often the open view reloads. Default 3s.
	Refresh time.Duration
	// Summary, when set, serves GET <mount>/api/summary: the counts the
	// header shows. Without it the header shows no counts.
	Summary func(ctx context.Context) (Summary, error)
}

// Summary is what the header shows: retries counted by kind and state.
type Summary struct {
	Counts []Count `json:"counts"`
}

// Count is the number of retries of one kind in one state.
type Count struct {
	Kind  string `json:"kind"`
	State string `json:"state"`
	Count int64  `json:"count"`
}

// Handler returns the dashboard. Mount it under a prefix with
// http.StripPrefix; it serves index.html at "/".
func Handler(cfg Config) http.Handler {
	if cfg.Title == "" {
		cfg.Title = "retryd"
	}
	if cfg.Refresh <= 0 {
		cfg.Refresh = 3 * time.Second
	}
	assets, err := fs.Sub(static, "static")
	if err != nil {
		panic(err) // embedded at build time
	}
	index, err := renderIndex(assets, cfg)
	if err != nil {
		panic(err) // the template is embedded at build time
	}
	csp := contentSecurityPolicy(cfg.APIBase)
	files := http.FileServer(http.FS(assets))
	mux := http.NewServeMux()
	mux.HandleFunc("GET /{$}", func(w http.ResponseWriter, _ *http.Request) {
		headers(w, csp)
		w.Header().Set("Content-Type", "text/html; charset=utf-8")
		_, _ = w.Write(index)
	})
	mux.HandleFunc("GET /index.html", func(w http.ResponseWriter, r *http.Request) {
		http.Redirect(w, r, "./", http.StatusMovedPermanently)
	})
	// The page and its assets hold no data and stay public (the sign-in
	// comes with them); the counts are a viewer's read.
	mux.Handle("GET /api/summary", serve.Require(serve.RoleViewer, http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		if cfg.Summary == nil {
			serve.WriteJSON(w, http.StatusNotFound, serve.ErrorBody{Error: serve.ErrorDetail{Code: serve.CodeNotFound, Message: "no summary on this server"}})
			return
		}
		sum, err := cfg.Summary(r.Context())
		if err != nil {
			serve.WriteError(w, err)
			return
		}
		if sum.Counts == nil {
			sum.Counts = []Count{}
		}
		w.Header().Set("Cache-Control", "no-store")
		serve.WriteJSON(w, http.StatusOK, sum)
	})))
	mux.HandleFunc("GET /", func(w http.ResponseWriter, r *http.Request) {
		headers(w, csp)
		w.Header().Set("Cache-Control", "no-cache")
		files.ServeHTTP(w, r)
	})
	return mux
}

func headers(w http.ResponseWriter, csp string) {
	h := w.Header()
	h.Set("Content-Security-Policy", csp)
	h.Set("X-Content-Type-Options", "nosniff")
	h.Set("Referrer-Policy", "no-referrer")
	h.Set("X-Frame-Options", "DENY")
}

// contentSecurityPolicy allows scripts, styles and API calls from the
// dashboard's origin (and the API's, when it is elsewhere) only.
func contentSecurityPolicy(apiBase string) string {
	connect := "'self'"
	if u, err := url.Parse(apiBase); err == nil && u.Scheme != "" && u.Host != "" {
		connect += " " + u.Scheme + "://" + u.Host
	}
	return strings.Join([]string{
		"default-src 'self'",
		"script-src 'self'",
		"style-src 'self'",
		"img-src 'self' data:",
		"connect-src " + connect,
		"frame-ancestors 'none'",
		"base-uri 'none'",
		"form-action 'none'",
	}, "; ")
}

func renderIndex(assets fs.FS, cfg Config) ([]byte, error) {
	raw, err := fs.ReadFile(assets, "index.html")
	if err != nil {
		return nil, err
	}
	tmpl, err := template.New("index").Parse(string(raw))
	if err != nil {
		return nil, err
	}
	var buf bytes.Buffer
	err = tmpl.Execute(&buf, map[string]any{
		"Title":     cfg.Title,
		"APIBase":   strings.TrimRight(cfg.APIBase, "/"),
		"RefreshMS": cfg.Refresh.Milliseconds(),
	})
	return buf.Bytes(), err
}
