package main

import (
	"cmp"
	"context"
	"errors"
	"fmt"
	"net"
	"net/http"
	"net/http/httputil"
	"net/url"
	"os"
	"os/signal"
	"syscall"

	"github.com/jackc/pgx/v5/pgxpool"
	"github.com/prometheus/client_golang/prometheus"
	"github.com/rs/zerolog"
	"github.com/spf13/cobra"

	"github.com/retryd/retryd/internal/auth"
	"github.com/retryd/retryd/internal/dashboard"
	"github.com/retryd/retryd/internal/serve"
	"github.com/retryd/retryd/services/ingress"
	"github.com/retryd/retryd/services/jobs"
	schedulersvc "github.com/retryd/retryd/services/scheduler"
	"github.com/retryd/retryd/services/triggers"
)

// upstreams are the services behind the gateway.
type upstreams struct {
	scheduler, ingress, triggers, jobs *url.URL
	// ingressOperator serves ingress's operator routes when ingress keeps
	// them on a listener of their own (RETRYD_OPERATOR_ADDR); nil: ingress.
	ingressOperator *url.URL
}

// route is the API paths one service owns.
type route struct {
	target   *url.URL
	prefixes []string
}

func (u upstreams) routes() []route {
	return []route{
		{u.scheduler, []string{"/v1/retries", "/v1/retries/", "/v1/policies", "/v1/policies/", "/v1/tokens", "/v1/tokens/", "/v1/audit"}},
		{u.ingress, []string{"/v1/events", "/v1/events:batch"}},
		{cmp.Or(u.ingressOperator, u.ingress), []string{"/v1/events/", "/v1/sources", "/v1/sources/"}},
		{u.triggers, []string{"/v1/triggers", "/v1/triggers/", "/v1/deliveries/", "/v1/runs", "/v1/runs/"}},
		{u.jobs, []string{"/v1/jobs", "/v1/jobs/", "/v1/analytics/", "/v1/operations/"}},
	}
}

// gatewayHandler serves the dashboard and every service's API on one
// origin, as `retryd dev` does in one process.
// transport (nil: the default) reaches the upstreams; it trusts
// RETRYD_CA_FILE for services that serve HTTPS with a private CA.
func gatewayHandler(u upstreams, transport http.RoundTripper, summary func(context.Context) (dashboard.Summary, error), reg prometheus.Gatherer, health *serve.Health, log zerolog.Logger) http.Handler {
	mux := serve.NewMux(reg, health)
	for _, rt := range u.routes() {
		target := rt.target
		proxy := &httputil.ReverseProxy{
			Transport: transport,
			Rewrite: func(r *httputil.ProxyRequest) {
				r.SetURL(target)
				r.SetXForwarded()
			},
			ErrorHandler: func(w http.ResponseWriter, r *http.Request, err error) {
				log.Warn().Err(err).Str("upstream", target.Host).Str("path", r.URL.Path).Msg("upstream unreachable")
				serve.WriteJSON(w, http.StatusBadGateway, serve.ErrorBody{Error: serve.ErrorDetail{
					Code: "bad_gateway", Message: "the service behind " + r.URL.Path + " is unreachable",
				}})
			},
		}
		for _, p := range rt.prefixes {
			mux.Handle(p, proxy)
		}
	}
	mux.Handle(serve.IndexPath, serve.IndexHandler(schedulersvc.Routes(), ingress.Routes(), triggers.Routes(), jobs.Routes(), auth.Routes()))
	mux.HandleFunc("/v1/", func(w http.ResponseWriter, r *http.Request) {
		serve.WriteJSON(w, http.StatusNotFound, serve.ErrorBody{Error: serve.ErrorDetail{
			Code: serve.CodeNotFound, Message: "no API route " + r.Method + " " + r.URL.Path,
		}})
	})
	mux.Handle("/ui/", http.StripPrefix("/ui", dashboard.Handler(dashboard.Config{Summary: summary})))
	mux.Handle("GET /{$}", http.RedirectHandler("/ui/", http.StatusFound))
	return mux
}

func newGatewayCmd(g *globals) *cobra.Command {
	var listen, scheduler, ingress, ingressOperator, triggers, jobsURL, dbURL string
	cmd := &cobra.Command{
		Use:   "gateway",
		Short: "Serve the dashboard and every service's API on one address",
		Long: `gateway puts the dashboard (/ui/) and the APIs of the separately deployed
services behind one address, routing each path to the service that owns it:
/v1/retries, /v1/policies, /v1/tokens and /v1/audit to the scheduler,
/v1/events and /v1/sources to ingress (its operator routes to
--ingress-operator when given), /v1/triggers, /v1/deliveries and /v1/runs to
triggers, /v1/jobs, /v1/analytics and /v1/operations to the jobs API (--jobs, by default the
scheduler). The CLI's --api points at it. With --database-url (or
DATABASE_URL) the dashboard shows the counts of retries by state.

Tokens (RETRYD_AUTH=tokens, the default) are passed on to the services,
which check them; the gateway checks them too for its own routes, so it
needs --database-url (SELECT, UPDATE on api_tokens). RETRYD_AUTH=off is
allowed on a loopback --listen only. With RETRYD_OIDC_ISSUER and
RETRYD_OIDC_AUDIENCE it accepts OIDC JWTs as well (docs/security.md);
give the services the same RETRYD_OIDC_* settings, as they check the
JWTs passed on to them.

RETRYD_HTTP_TLS_CERT and RETRYD_HTTP_TLS_KEY make it serve HTTPS; with
https:// upstreams signed by a private CA, RETRYD_CA_FILE (--ca-file) names
the CA to trust.`,
		Example: `  retryd gateway --scheduler http://scheduler:8080 --ingress http://ingress:8081 --triggers http://triggers:8082`,
		Args:    args(0),
		RunE: func(cmd *cobra.Command, _ []string) error {
			u := upstreams{}
			for _, f := range []struct {
				name string
				raw  string
				dst  **url.URL
			}{{"scheduler", scheduler, &u.scheduler}, {"ingress", ingress, &u.ingress}, {"ingress-operator", ingressOperator, &u.ingressOperator},
				{"triggers", triggers, &u.triggers}, {"jobs", jobsURL, &u.jobs}} {
				if f.raw == "" && f.name == "jobs" {
					f.raw = scheduler
				}
				if f.raw == "" && f.name == "ingress-operator" {
					f.raw = ingress
				}
				p, err := url.Parse(f.raw)
				if err != nil || (p.Scheme != "http" && p.Scheme != "https") || p.Host == "" {
					return usageErrorf(cmd, "--%s %q is not an http(s) URL", f.name, f.raw)
				}
				*f.dst = p
			}
			log := zerolog.New(g.stderr).With().Timestamp().Str("service", "retryd-gateway").Logger()
			ctx, stop := signal.NotifyContext(cmd.Context(), syscall.SIGTERM, os.Interrupt)
			defer stop()
			authCfg, err := auth.FromEnv(nil)
			if err != nil {
				return usageErr(err)
			}
			tlsCfg, err := serve.TLSFromEnv().Server()
			if err != nil {
				return usageErr(err)
			}
			transport, err := g.transport()
			if err != nil {
				return err
			}
			if authCfg.Mode == auth.ModeTokens && dbURL == "" {
				return usageErrorf(cmd, "%s=tokens (the default) needs --database-url (or DATABASE_URL) to check tokens; or %s=off on a loopback --listen", auth.EnvMode, auth.EnvMode)
			}
			var summary func(context.Context) (dashboard.Summary, error)
			var pool *pgxpool.Pool
			if dbURL != "" {
				pcfg, err := pgxpool.ParseConfig(dbURL)
				if err != nil {
					return usageErrorf(cmd, "--database-url: %v", err)
				}
				pcfg.MaxConns = 2
				pool, err = pgxpool.NewWithConfig(ctx, pcfg)
				if err != nil {
					return fmt.Errorf("open database: %w", err)
				}
				defer pool.Close()
				summary = func(ctx context.Context) (dashboard.Summary, error) { return schedulersvc.Summary(ctx, pool) }
			}
			// The services check the tokens the gateway passes on; the
			// gateway checks them for its own routes (index, dashboard
			// counts, metrics).
			guard, _, err := authCfg.Guard(ctx, pool, log, listen)
			if err != nil {
				return err
			}
			reg := serve.NewRegistry()
			health := &serve.Health{}
			ln, err := net.Listen("tcp", listen)
			if err != nil {
				return fmt.Errorf("listen on %s: %w", listen, err)
			}
			srv := serve.NewServer("", guard.Handler(gatewayHandler(u, transport, summary, reg, health, log)))
			srv.TLSConfig = tlsCfg
			health.SetReady(true)
			fmt.Fprintf(g.stdout, "retryd gateway on %s://%s (dashboard /ui/)\n", serve.TLSFromEnv().Scheme(), ln.Addr())
			// Not ready first, so load balancers stop sending, then drain.
			go func() {
				<-ctx.Done()
				health.SetReady(false)
			}()
			if err := serve.Serve(ctx, srv, ln, log); err != nil && !errors.Is(err, context.Canceled) {
				return err
			}
			return nil
		},
	}
	f := cmd.Flags()
	f.StringVar(&listen, "listen", ":8080", "listen address")
	f.StringVar(&scheduler, "scheduler", "http://127.0.0.1:8080", "scheduler base URL")
	f.StringVar(&ingress, "ingress", "http://127.0.0.1:8081", "ingress base URL")
	f.StringVar(&ingressOperator, "ingress-operator", "", "ingress's operator API base URL, when ingress serves it apart (RETRYD_OPERATOR_ADDR; default --ingress)")
	f.StringVar(&triggers, "triggers", "http://127.0.0.1:8082", "triggers base URL")
	f.StringVar(&jobsURL, "jobs", "", "jobs API base URL (default --scheduler)")
	f.StringVar(&dbURL, "database-url", os.Getenv("DATABASE_URL"), "Postgres URL for the dashboard's counts (optional)")
	return cmd
}
