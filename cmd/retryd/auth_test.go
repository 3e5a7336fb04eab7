package main

import (
	"context"
	"encoding/json"
	"io"
	"net/http"
	"net/http/httptest"
	"net/url"
	"regexp"
	"strings"
	"testing"
	"time"

	"github.com/chromedp/chromedp"
	"github.com/prometheus/client_golang/prometheus"
	"github.com/rs/zerolog"
	"github.com/stretchr/testify/require"

	"github.com/retryd/retryd/cmd/retryd/internal/devstack"
	"github.com/retryd/retryd/internal/auth"
	"github.com/retryd/retryd/internal/dashboard"
	"github.com/retryd/retryd/internal/serve"
	"github.com/retryd/retryd/pkg/contract"
	"github.com/retryd/retryd/services/ingress"
	"github.com/retryd/retryd/services/jobs"
	"github.com/retryd/retryd/services/scheduler"
	"github.com/retryd/retryd/services/triggers"
)

// setupTokens is setup with tokens on: the stack makes its admin token.
func setupTokens(t *testing.T) *bundle {
	t.Helper()
	b := setupStack(t, devstack.Config{Auth: auth.Config{Mode: auth.ModeTokens}})
	require.NotEmpty(t, b.stack.AdminToken())
	return b
}

// viewerToken creates a token of role viewer named name, as the admin.
func (b *bundle) viewerToken(t *testing.T, name string) string {
	t.Helper()
	r := cli(t, "--api", b.api, "--token", b.stack.AdminToken(), "tokens", "create", "--name", name, "--role", "viewer")
	require.Equal(t, exitOK, r.code, r.stderr)
	return strings.TrimSpace(r.stdout)
}

// call sends one request with an optional bearer token and returns the
// status and body.
func call(t *testing.T, method, url, token, body string) (int, string) {
	t.Helper()
	var rd io.Reader
	if body != "" {
		rd = strings.NewReader(body)
	}
	req, err := http.NewRequest(method, url, rd)
	require.NoError(t, err)
	if body != "" {
		req.Header.Set("Content-Type", "application/json")
	}
	if token != "" {
		req.Header.Set("Authorization", "Bearer "+token)
	}
	return do(t, req)
}

// do sends req and returns the status and body of the answer.
func do(t *testing.T, req *http.Request) (int, string) {
	t.Helper()
	resp, err := http.DefaultClient.Do(req)
	require.NoError(t, err)
	defer resp.Body.Close()
	b, err := io.ReadAll(resp.Body)
	require.NoError(t, err)
	return resp.StatusCode, string(b)
}

var pathParam = regexp.MustCompile(`\{[a-z_]+\}`)

// Every route of every service, under every role, with no token and with
// a bad one: 401 without a valid token, 403 when the role is not enough,
// served otherwise. A route without a role fails here (and panics when
// mounted).
func TestEveryRouteUnderEveryRole(t *testing.T) {
	t.Parallel()
	b := setupTokens(t)
	admin := b.stack.AdminToken()
	tokens := map[serve.Role]string{serve.RoleAdmin: admin}
	for _, r := range []serve.Role{serve.RoleProducer, serve.RoleViewer, serve.RoleOperator} {
		code, body := call(t, "POST", b.api+"/v1/tokens", admin, `{"name":"walk-`+r.String()+`","role":"`+r.String()+`"}`)
		require.Equal(t, http.StatusCreated, code, body)
		var c auth.Created
		require.NoError(t, json.Unmarshal([]byte(body), &c))
		tokens[r] = c.Secret
	}

	// The routes the binaries serve: every service's table, the index,
	// the dashboard and the health and metrics routes.
	var routes []serve.Route
	for _, l := range [][]serve.Route{scheduler.Routes(), ingress.Routes(), triggers.Routes(), jobs.Routes(), auth.Routes()} {
		routes = append(routes, l...)
	}
	code, body := call(t, "GET", b.api+"/v1/", admin, "")
	require.Equal(t, http.StatusOK, code)
	var idx serve.Index
	require.NoError(t, json.Unmarshal([]byte(body), &idx))
	require.Len(t, idx.Routes, len(routes)+1, "the index lists every route and itself")
	routes = append(routes,
		serve.Route{Method: "GET", Path: "/v1/", Role: serve.IndexRole},
		serve.Route{Method: "GET", Path: "/ui/api/summary", Role: serve.RoleViewer},
		serve.Route{Method: "GET", Path: "/ui/", Role: serve.RolePublic},
		serve.Route{Method: "GET", Path: "/healthz", Role: serve.RolePublic},
		serve.Route{Method: "GET", Path: "/readyz", Role: serve.RolePublic},
		serve.Route{Method: "GET", Path: "/metrics", Role: serve.RolePublic},
	)

	callers := map[string]string{"none": "", "bad": auth.Prefix + strings.Repeat("0", 43)}
	for r, tok := range tokens {
		callers[r.String()] = tok
	}
	for _, rt := range routes {
		require.NotEqual(t, serve.Role(0), rt.Role, "%s %s has no role", rt.Method, rt.Path)
		path := pathParam.ReplaceAllStringFunc(rt.Path, func(p string) string {
			if p == "{kind}" {
				return "job"
			}
			return "walk-" + strings.Trim(p, "{}")
		})
		body := ""
		if rt.Method == "POST" || rt.Method == "PUT" {
			body = "{}"
		}
		for who, tok := range callers {
			code, resp := call(t, rt.Method, b.api+path, tok, body)
			what := rt.Method + " " + path + " as " + who
			role, isRole := serve.ParseRole(who)
			switch {
			case rt.Role == serve.RolePublic:
				require.Equal(t, http.StatusOK, code, "%s: %s", what, resp)
			case isRole != nil: // no token, bad token
				require.Equal(t, http.StatusUnauthorized, code, "%s: %s", what, resp)
			case !role.Allows(rt.Role):
				require.Equal(t, http.StatusForbidden, code, "%s: %s", what, resp)
				require.Contains(t, resp, `"code":"forbidden"`)
			default:
				require.NotContains(t, []int{401, 403}, code, "%s: %s", what, resp)
				require.Less(t, code, 500, "%s: %s", what, resp)
				if rt.Method == "GET" && !strings.Contains(rt.Path, "{") {
					require.Equal(t, http.StatusOK, code, "%s: %s", what, resp)
				}
			}
		}
	}
}

// The CLI manages tokens with an admin token, a revoked token stops
// working within the cache TTL, and the CLI says what to do on a 401.
func TestTokensCLI(t *testing.T) {
	t.Parallel()
	b := setupTokens(t)
	admin := b.stack.AdminToken()

	r := b.cli(t, "retries", "list")
	require.Equal(t, exitFailed, r.code)
	require.Contains(t, r.stderr, "HTTP 401 unauthenticated")
	require.Contains(t, r.stderr, "--token or set RETRYD_TOKEN")

	created := b.ok(t, "--token", admin, "tokens", "create", "--name", "oncall", "--role", "operator", "--expires", "720h")
	secret := strings.TrimSpace(created)
	require.True(t, strings.HasPrefix(secret, auth.Prefix), created)
	b.ok(t, "--token", secret, "retries", "list")

	// Audit records name the token, whatever the body claims.
	code, body := call(t, "POST", b.api+"/v1/sources/audited/pause", secret, `{"reason":"maintenance"}`)
	require.Equal(t, http.StatusOK, code, body)
	require.Contains(t, body, `"updated_by":"oncall"`)
	code, body = call(t, "PUT", b.api+"/v1/policies/job/audited", admin,
		`{"name":"audited","max_retries":3,"base_delay_ms":1000,"max_delay_ms":2000,"updated_by":"mallory"}`)
	require.Equal(t, http.StatusCreated, code, body)
	require.Contains(t, body, `"updated_by":"bootstrap"`)
	require.NotContains(t, body, "mallory")
	r = b.cli(t, "--token", secret, "tokens", "list")
	require.Equal(t, exitFailed, r.code, "an operator may not manage tokens")
	require.Contains(t, r.stderr, "HTTP 403 forbidden")

	var list struct {
		Tokens []auth.Token `json:"tokens"`
	}
	b.okJSON(t, &list, "--token", admin, "tokens", "list")
	var id string
	for _, tk := range list.Tokens {
		if tk.Name == "oncall" {
			id = tk.ID
			require.Equal(t, serve.RoleOperator, tk.Role)
			require.NotNil(t, tk.ExpiresAt)
		}
	}
	require.NotEmpty(t, id)
	table := b.ok(t, "--token", admin, "tokens", "list")
	require.Contains(t, table, "oncall")
	require.NotContains(t, table, secret)

	require.Contains(t, b.ok(t, "--token", admin, "tokens", "revoke", id), "revoked "+id)
	require.Eventually(t, func() bool {
		code, _ := call(t, "GET", b.api+"/v1/retries", secret, "")
		return code == http.StatusUnauthorized
	}, auth.DefaultCacheTTL+10*time.Second, 100*time.Millisecond, "a revoked token works past the cache TTL")
}

// With tokens on, the dashboard asks for a token, refuses a bad one,
// keeps a good one in an HttpOnly cookie the page cannot read, and then
// loads its data.
func TestDashboardSignIn(t *testing.T) {
	t.Parallel()
	ctx := browser(t)
	b := setupTokens(t)
	dialogInput := `.dialog input[name="token"]`
	require.NoError(t, chromedp.Do(ctx,
		chromedp.Navigate(b.api+"/ui/"),
		chromedp.WaitVisible(chromedp.CSS(dialogInput)),
		chromedp.SendKeys(chromedp.CSS(dialogInput), auth.Prefix+strings.Repeat("x", 43)),
		chromedp.Click(chromedp.CSS(`[data-test="dialog-confirm"]`)),
		chromedp.WaitVisible(chromedp.CSS(`.dialog .error`)),
	))
	require.Contains(t, text(t, ctx, `.dialog .error`), "unknown token")
	require.NoError(t, chromedp.Do(ctx,
		chromedp.SetValue(chromedp.CSS(dialogInput), b.stack.AdminToken()),
		chromedp.Click(chromedp.CSS(`[data-test="dialog-confirm"]`)),
		poll(`document.querySelector('#summary .chip[data-state="scheduled"]') !== null`),
		poll(`document.querySelector('.dialog') === null`),
		poll(`document.getElementById("banner").hidden`),
	))
	require.False(t, eval[bool](t, ctx, `document.cookie.includes("rtd_")`), "the session cookie is HttpOnly")

	// The admin sees who is signed in, a sign-out, and the actions on a
	// pending retry.
	id := contract.NewID()
	b.fail(t, id, "ui_roles", 1, "timeout", "upstream timed out")
	rowCancel := `document.querySelector('[data-test="row-cancel"]')`
	require.NoError(t, chromedp.Do(ctx,
		poll(`document.getElementById("whoami").textContent === "bootstrap (admin)"`),
		poll(`!document.getElementById("signout").hidden`),
		poll(rowCancel+` !== null && `+rowCancel+`.offsetParent !== null`),
	))

	// Signed out and in again as a viewer: the retry is listed, but no
	// cancel or retry button is offered.
	viewer := b.viewerToken(t, "ui-viewer")
	require.NoError(t, chromedp.Do(ctx,
		chromedp.Click(chromedp.CSS(`[data-test="signout"]`)),
		chromedp.WaitVisible(chromedp.CSS(dialogInput)),
		chromedp.SetValue(chromedp.CSS(dialogInput), viewer),
		chromedp.Click(chromedp.CSS(`[data-test="dialog-confirm"]`)),
		poll(`document.getElementById("whoami").textContent === "ui-viewer (viewer)"`),
		poll(`document.body.innerText.includes("`+id+`")`),
	))
	for _, sel := range []string{"row-cancel", "row-retry"} {
		require.True(t, eval[bool](t, ctx, `[...document.querySelectorAll('[data-test="`+sel+`"]')].every((b) => b.offsetParent === null)`),
			"a viewer is offered no %s", sel)
	}
}

// retryd dev on a listener that is not loopback checks tokens: it prints
// an admin token once, and the API refuses requests without it.
func TestDevBeyondLoopbackChecksTokens(t *testing.T) {
	t.Parallel()
	d := startDev(t, "--http", "0.0.0.0:0")
	m := regexp.MustCompile(`Admin token, shown once:\s+(rtd_\S+)`).FindStringSubmatch(d.out.String())
	require.NotNil(t, m, d.out.String())
	code, _ := call(t, "GET", d.url+"/v1/retries", "", "")
	require.Equal(t, http.StatusUnauthorized, code)
	code, body := call(t, "GET", d.url+"/v1/retries", m[1], "")
	require.Equal(t, http.StatusOK, code, body)
	code, _ = call(t, "GET", d.url+"/healthz", "", "")
	require.Equal(t, http.StatusOK, code)
}

// RETRYD_AUTH=tokens, the default, needs a database for the gateway to
// check tokens.
func TestGatewayNeedsADatabaseToCheckTokens(t *testing.T) {
	t.Parallel()
	r := cli(t, "gateway", "--database-url", "", "--listen", "127.0.0.1:0")
	require.Equal(t, exitUsage, r.code, r.stderr)
	require.Contains(t, r.stderr, "RETRYD_AUTH=tokens (the default) needs --database-url")
}

// Behind the gateway with tokens on, its own routes check the token, and
// the token routes and the services' routes reach the service with the
// caller's token.
func TestGatewayWithTokens(t *testing.T) {
	t.Parallel()
	b := setupTokens(t)
	admin := b.stack.AdminToken()
	up, err := url.Parse(b.api)
	require.NoError(t, err)
	guard, _, err := auth.Config{Mode: auth.ModeTokens}.Guard(b.ctx, b.stack.Pool, zerolog.Nop(), "127.0.0.1:0")
	require.NoError(t, err)
	health := &serve.Health{}
	health.SetReady(true)
	gw := httptest.NewServer(guard.Handler(gatewayHandler(upstreams{scheduler: up, ingress: up, triggers: up, jobs: up}, nil,
		func(ctx context.Context) (dashboard.Summary, error) { return b.stack.Summary(ctx) },
		prometheus.NewRegistry(), health, zerolog.Nop())))
	t.Cleanup(gw.Close)

	for _, path := range []string{"/v1/", "/ui/api/summary", "/v1/retries", "/v1/tokens"} {
		code, _ := call(t, "GET", gw.URL+path, "", "")
		require.Equal(t, http.StatusUnauthorized, code, path)
		code, body := call(t, "GET", gw.URL+path, admin, "")
		require.Equal(t, http.StatusOK, code, "%s: %s", path, body)
	}
	code, _ := call(t, "GET", gw.URL+"/readyz", "", "")
	require.Equal(t, http.StatusOK, code)
	r := cli(t, "--api", gw.URL, "--token", admin, "tokens", "create", "--name", "via-gateway", "--role", "viewer")
	require.Equal(t, exitOK, r.code, r.stderr)
}
