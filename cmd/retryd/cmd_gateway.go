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
	"slices"
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
	// schedulers are the scheduler shards in shard order when there are
	// more than one (scheduler is then the first): see schedulerShards.
	schedulers []*url.URL
	// ingressOperator serves ingress's operator routes when ingress keeps
	// them on a listener of their own (RETRYD_OPERATOR_ADDR); nil: ingress.
	ingressOperator *url.URL
}

// route is the API paths one service owns.
type route struct {
	target   *url.URL
	prefixes []string
	// scheduler: the scheduler's routes, which shards split (schedulerShards).
	scheduler bool
}

func (u upstreams) routes() []route {
	return []route{
		{u.scheduler, []string{"/v1/retries", "/v1/retries/", "/v1/policies", "/v1/policies/", "/v1/tokens", "/v1/tokens/", "/v1/audit"}, true},
		{u.ingress, []string{"/v1/events", "/v1/events:batch"}, false},
		{cmp.Or(u.ingressOperator, u.ingress), []string{"/v1/events/", "/v1/sources", "/v1/sources/"}, false},
		{u.triggers, []string{"/v1/triggers", "/v1/triggers/", "/v1/deliveries/", "/v1/runs", "/v1/runs/"}, false},
		{u.jobs, []string{"/v1/jobs", "/v1/jobs/", "/v1/analytics/", "/v1/operations/"}, false},
	}
}

// gatewayHandler serves the dashboard and every service's API on one
// origin, as `retryd dev` does in one process.
// transport (nil: the default) reaches the upstreams; it trusts
// RETRYD_CA_FILE for services that serve HTTPS with a private CA.
func gatewayHandler(u upstreams, transport http.RoundTripper, summary func(context.Context) (dashboard.Summary, error), reg prometheus.Gatherer, health *serve.Health, log zerolog.Logger) http.Handler {
	mux := serve.NewMux(reg, health)
	for _, rt := range u.routes() {
		if rt.scheduler && len(u.schedulers) > 1 {
			newSchedulerShards(u.schedulers, transport, newProxy(u.scheduler, transport, log), log).register(mux)
			continue
		}
		proxy := newProxy(rt.target, transport, log)
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

// newProxy proxies to target, answering 502 when it is unreachable.
func newProxy(target *url.URL, transport http.RoundTripper, log zerolog.Logger) *httputil.ReverseProxy {
	return &httputil.ReverseProxy{
		Transport: transport,
		Rewrite: func(r *httputil.ProxyRequest) {
			r.SetURL(target)
			r.SetXForwarded()
		},
		ErrorHandler: func(w http.ResponseWriter, r *http.Request, err error) {
			log.Warn().Err(err).Str("upstream", target.Host).Str("path", r.URL.Path).Msg("upstream unreachable")
			writeBadGateway(w, "the service behind "+r.URL.Path+" is unreachable")
		},
	}
}

func newGatewayCmd(g *globals) *cobra.Command {
	var listen, ingress, ingressOperator, triggers, jobsURL string
	var schedulerURLs, dbURLs []string
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

With scheduler shards (RETRYD_SHARDS; docs/shards.md), give --scheduler
once per shard in shard order (repeated or comma-separated), and
--database-url once per shard in the same order, the first being the home
shard's (shard 0): the gateway sends each item's requests to its shard,
lists the retries of every shard as one list, writes policies to every
shard and sends the rest (policy reads, tokens, audit, jobs) to shard 0.

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
		Example: `  retryd gateway --scheduler http://scheduler:8080 --ingress http://ingress:8081 --triggers http://triggers:8082
  retryd gateway --scheduler http://scheduler-0:8080,http://scheduler-1:8080 \
    --database-url postgres://…/retryd --database-url postgres://…/retryd_shard1 --ingress …`,
		Args: args(0),
		RunE: func(cmd *cobra.Command, _ []string) error {
			u := upstreams{}
			var err error
			if u.schedulers, err = schedulerShardURLs(schedulerURLs); err != nil {
				return usageErrorf(cmd, "%v", err)
			}
			u.scheduler = u.schedulers[0]
			if len(u.schedulers) == 1 {
				u.schedulers = nil // one scheduler: every route proxied as it is
			}
			dbURLs = slices.DeleteFunc(dbURLs, func(s string) bool { return s == "" }) // --database-url "": none
			if len(dbURLs) > 0 && len(dbURLs) != len(schedulerURLs) {
				return usageErrorf(cmd, "--database-url is given %d times for %d --scheduler shards: give one per shard, in shard order (the dashboard counts every shard's retries)",
					len(dbURLs), len(schedulerURLs))
			}
			for _, f := range []struct {
				name string
				raw  string
				dst  **url.URL
			}{{"ingress", ingress, &u.ingress}, {"ingress-operator", ingressOperator, &u.ingressOperator},
				{"triggers", triggers, &u.triggers}, {"jobs", jobsURL, &u.jobs}} {
				if f.raw == "" && f.name == "jobs" {
					f.raw = u.scheduler.String()
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
			if authCfg.Mode == auth.ModeTokens && len(dbURLs) == 0 {
				return usageErrorf(cmd, "%s=tokens (the default) needs --database-url (or DATABASE_URL) to check tokens; or %s=off on a loopback --listen", auth.EnvMode, auth.EnvMode)
			}
			var summary func(context.Context) (dashboard.Summary, error)
			var pool *pgxpool.Pool
			if len(dbURLs) > 0 {
				pools := make([]*pgxpool.Pool, 0, len(dbURLs))
				defer func() {
					for _, p := range pools {
						p.Close()
					}
				}()
				for i, raw := range dbURLs {
					pcfg, err := pgxpool.ParseConfig(raw)
					if err != nil {
						return usageErrorf(cmd, "--database-url (shard %d): %v", i, err)
					}
					pcfg.MaxConns = 2
					p, err := pgxpool.NewWithConfig(ctx, pcfg)
					if err != nil {
						return fmt.Errorf("open database of shard %d: %w", i, err)
					}
					pools = append(pools, p)
				}
				pool = pools[0]
				summary = func(ctx context.Context) (dashboard.Summary, error) { return schedulersvc.Summary(ctx, pool) }
				if len(pools) > 1 {
					summary = func(ctx context.Context) (dashboard.Summary, error) { return shardsSummary(ctx, pools) }
				}
			}
			// The services check the tokens the gateway passes on; the
			// gateway checks them for its own routes (index, dashboard
			// counts, metrics), in the home shard's database.
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
	f.StringSliceVar(&schedulerURLs, "scheduler", []string{"http://127.0.0.1:8080"}, "scheduler base URL; with shards, one per shard in shard order (repeat the flag, or separate with commas)")
	f.StringVar(&ingress, "ingress", "http://127.0.0.1:8081", "ingress base URL")
	f.StringVar(&ingressOperator, "ingress-operator", "", "ingress's operator API base URL, when ingress serves it apart (RETRYD_OPERATOR_ADDR; default --ingress)")
	f.StringVar(&triggers, "triggers", "http://127.0.0.1:8082", "triggers base URL")
	f.StringVar(&jobsURL, "jobs", "", "jobs API base URL (default --scheduler)")
	var defaultDB []string
	if v := os.Getenv("DATABASE_URL"); v != "" {
		defaultDB = []string{v}
	}
	f.StringArrayVar(&dbURLs, "database-url", defaultDB, "Postgres URL for the dashboard's counts and token checks (default $DATABASE_URL); with shards, one per shard in shard order, repeating the flag")
	return cmd
}
