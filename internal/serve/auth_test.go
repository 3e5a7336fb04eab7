package serve_test

import (
	"context"
	"fmt"
	"net/http"
	"net/http/httptest"
	"strings"
	"testing"

	"github.com/stretchr/testify/require"

	"github.com/retryd/retryd/internal/serve"
)

// tokens is an Authenticator over a fixed map; "broken" fails the check
// itself, as a Postgres outage would; "norole" is a valid credential
// granting no role (an OIDC token without the role claim).
type tokens map[string]serve.Principal

func (m tokens) Authenticate(_ context.Context, tok string) (serve.Principal, error) {
	if tok == "broken" {
		return serve.Principal{}, fmt.Errorf("look up token: connection refused")
	}
	if tok == "norole" {
		return serve.Principal{}, fmt.Errorf(`"oidc:ann" has no role in claim "retryd_role": %w`, serve.ErrNoRole)
	}
	p, ok := m[tok]
	if !ok {
		return serve.Principal{}, fmt.Errorf("token: %w", serve.ErrBadCredential)
	}
	return p, nil
}

func TestRoleAllows(t *testing.T) {
	t.Parallel()
	want := map[serve.Role][]serve.Role{ // role -> the route roles it may use
		serve.RoleProducer: {serve.RolePublic, serve.RoleProducer},
		serve.RoleViewer:   {serve.RolePublic, serve.RoleViewer},
		serve.RoleOperator: {serve.RolePublic, serve.RoleViewer, serve.RoleOperator},
		serve.RoleAdmin:    {serve.RolePublic, serve.RoleProducer, serve.RoleViewer, serve.RoleOperator, serve.RoleAdmin},
	}
	all := append([]serve.Role{serve.RolePublic}, serve.Roles()...)
	for role, allowed := range want {
		for _, need := range all {
			require.Equal(t, contains(allowed, need), role.Allows(need), "%s using a %s route", role, need)
		}
	}
	for _, r := range serve.Roles() {
		p, err := serve.ParseRole(r.String())
		require.NoError(t, err)
		require.Equal(t, r, p)
	}
	_, err := serve.ParseRole("root")
	require.ErrorContains(t, err, `unknown role "root"`)
}

func contains(rs []serve.Role, r serve.Role) bool {
	for _, x := range rs {
		if x == r {
			return true
		}
	}
	return false
}

func TestMountPanicsOnARouteWithoutRole(t *testing.T) {
	t.Parallel()
	eps := []serve.Endpoint[*greeter]{{Route: serve.Route{Method: http.MethodGet, Path: "/v1/x"}, Serve: (*greeter).hello}}
	require.PanicsWithValue(t, "serve: GET /v1/x has no role: every endpoint must name the role it needs",
		func() { serve.Mount(http.NewServeMux(), &greeter{}, eps) })
}

// Every answer of the guard and the route rules: public routes for
// anyone, 401 with a challenge without a valid token, 403 for a role that
// is not enough, 503 when the check fails, and the handler sees the
// principal.
func TestGuardAndRequire(t *testing.T) {
	t.Parallel()
	mux := serve.NewMux(nil, nil)
	serve.Mount(mux, &greeter{name: "g"}, greeterEndpoints)
	mux.Handle("GET /v1/produce", serve.Require(serve.RoleProducer, http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		p, ok := serve.PrincipalFrom(r.Context())
		require.True(t, ok)
		serve.WriteJSON(w, http.StatusOK, p)
	})))
	toks := tokens{
		"v": {Name: "ci-viewer", Role: serve.RoleViewer},
		"o": {Name: "oncall", Role: serve.RoleOperator},
		"p": {Name: "shop", Role: serve.RoleProducer},
	}
	h := serve.Guard{Verifier: toks}.Handler(mux)
	do := func(method, path, auth string) *httptest.ResponseRecorder {
		req := httptest.NewRequest(method, path, nil)
		if auth != "" {
			req.Header.Set("Authorization", auth)
		}
		rec := httptest.NewRecorder()
		h.ServeHTTP(rec, req)
		return rec
	}
	for _, tc := range []struct {
		method, path, auth string
		code               int
	}{
		{"GET", "/healthz", "", 200},
		{"GET", "/healthz", "Bearer nope", 200},
		{"GET", "/metrics", "", 200},
		{"GET", "/v1/hello/ann", "", 401},
		{"GET", "/v1/hello/ann", "Bearer nope", 401},
		{"GET", "/v1/hello/ann", "Basic dTpw", 401},
		{"GET", "/v1/hello/ann", "Bearer broken", 503},
		{"GET", "/v1/hello/ann", "Bearer norole", 403},
		{"GET", "/healthz", "Bearer norole", 200},
		{"GET", "/v1/hello/ann", "Bearer v", 200},
		{"GET", "/v1/hello/ann", "bearer o", 200},
		{"GET", "/v1/hello/ann", "Bearer p", 403},
		{"POST", "/v1/hello", "Bearer v", 403},
		{"POST", "/v1/hello", "Bearer o", 200},
		{"GET", "/v1/produce", "Bearer p", 200},
		{"GET", "/v1/produce", "Bearer o", 403},
	} {
		rec := do(tc.method, tc.path, tc.auth)
		require.Equal(t, tc.code, rec.Code, "%s %s with %q: %s", tc.method, tc.path, tc.auth, rec.Body)
		switch tc.code {
		case 401:
			require.Contains(t, rec.Header().Get("WWW-Authenticate"), "Bearer")
			require.Contains(t, rec.Body.String(), `"code":"unauthenticated"`)
		case 403:
			require.Contains(t, rec.Body.String(), `"code":"forbidden"`)
		}
	}
	require.JSONEq(t, `{"name":"shop","role":"producer"}`, do("GET", "/v1/produce", "Bearer p").Body.String())

	// A route behind no guard refuses: secure by default.
	rec := httptest.NewRecorder()
	mux.ServeHTTP(rec, httptest.NewRequest("GET", "/v1/hello/ann", nil))
	require.Equal(t, http.StatusUnauthorized, rec.Code)

	// The session cookie is a credential too.
	req := httptest.NewRequest("GET", "/v1/hello/ann", nil)
	req.AddCookie(&http.Cookie{Name: serve.SessionCookie, Value: "v"})
	rec = httptest.NewRecorder()
	h.ServeHTTP(rec, req)
	require.Equal(t, http.StatusOK, rec.Code)
}

func TestGuardMetricsRole(t *testing.T) {
	t.Parallel()
	h := serve.Guard{Verifier: tokens{"v": {Name: "prom", Role: serve.RoleViewer}}, MetricsRole: serve.RoleViewer}.Handler(serve.NewMux(nil, nil))
	rec := httptest.NewRecorder()
	h.ServeHTTP(rec, httptest.NewRequest("GET", "/metrics", nil))
	require.Equal(t, http.StatusUnauthorized, rec.Code)
	req := httptest.NewRequest("GET", "/metrics", nil)
	req.Header.Set("Authorization", "Bearer v")
	rec = httptest.NewRecorder()
	h.ServeHTTP(rec, req)
	require.Equal(t, http.StatusOK, rec.Code)
}

func TestGuardOffIsLocalAdmin(t *testing.T) {
	t.Parallel()
	mux := http.NewServeMux()
	serve.Mount(mux, &greeter{}, greeterEndpoints)
	rec := httptest.NewRecorder()
	serve.Guard{}.Handler(mux).ServeHTTP(rec, httptest.NewRequest("POST", "http://127.0.0.1:8080/v1/hello", nil))
	require.Equal(t, http.StatusOK, rec.Code)
}

// With authentication off, a request whose Host is not loopback is
// refused on every path, public ones and the sign-in included: a page
// whose name its DNS rebinds to 127.0.0.1 sends its own name, and the
// browser counts it same-origin. With tokens on, Host does not matter.
func TestGuardOffServesOnlyLoopbackHosts(t *testing.T) {
	t.Parallel()
	mux := serve.NewMux(nil, &serve.Health{})
	serve.Mount(mux, &greeter{}, greeterEndpoints)
	off := serve.Guard{}.Handler(mux)
	on := serve.Guard{Verifier: tokens{"rtd_v": {Name: "ann", Role: serve.RoleOperator}}}.Handler(mux)
	send := func(h http.Handler, method, path, host string) *httptest.ResponseRecorder {
		req := httptest.NewRequest(method, path, strings.NewReader(`{"token":"rtd_v"}`))
		req.Host = host
		req.Header.Set("Content-Type", "application/json")
		req.Header.Set("Sec-Fetch-Site", "same-origin")
		req.Header.Set("Authorization", "Bearer rtd_v")
		rec := httptest.NewRecorder()
		serve.NewServer("", h).Handler.ServeHTTP(rec, req)
		return rec
	}
	for _, host := range []string{"rebind.example:8080", "rebind.example", "localhost.rebind.example", "127.0.0.1.nip.io:8080",
		"0.0.0.0:8080", "10.0.0.1", "[::]:8080", "[::1%25lo]:8080", ""} {
		for _, path := range []string{"/v1/hello", "/healthz", "/metrics", serve.LoginPath, serve.WhoamiPath} {
			method := http.MethodGet
			if path == "/v1/hello" || path == serve.LoginPath {
				method = http.MethodPost
			}
			rec := send(off, method, path, host)
			require.Equal(t, http.StatusForbidden, rec.Code, "%s %s", host, path)
			require.Contains(t, rec.Body.String(), `"code":"foreign_host"`)
			require.Contains(t, rec.Body.String(), "RETRYD_AUTH=tokens", "says how to serve other names")
		}
		rec := send(on, http.MethodPost, "/v1/hello", host)
		require.Equal(t, http.StatusOK, rec.Code, "tokens on: %q", host)
	}
	for _, host := range []string{"127.0.0.1:8080", "127.0.0.1", "localhost:8080", "LOCALHOST", "localhost.:8080",
		"[::1]:8080", "[::1]", "[0:0:0:0:0:0:0:1]:8080", "127.1.2.3:8080"} {
		rec := send(off, http.MethodPost, "/v1/hello", host)
		require.Equal(t, http.StatusOK, rec.Code, "%s: %s", host, rec.Body.String())
	}
}

func TestIsLoopback(t *testing.T) {
	t.Parallel()
	for addr, want := range map[string]bool{
		"127.0.0.1:8080": true, "[::1]:80": true, "localhost:1": true, "127.0.0.2:9": true,
		":8080": false, "0.0.0.0:8080": false, "10.0.0.1:80": false, "[::]:80": false, "example.com:80": false,
		// Host headers: no port, IPv6 in brackets, localhost's absolute
		// form and any case.
		"127.0.0.1": true, "[::1]": true, "localhost": true, "localhost.": true, "LocalHost.:8080": true,
		"[::ffff:127.0.0.1]:80": true, "": false, "[::1": false, "localhost]": false, "localhost..": false,
		"localhost.example": false, "127.0.0.1.": false, "2130706433": false,
	} {
		require.Equal(t, want, serve.IsLoopback(addr), addr)
	}
}

// The dashboard's sign-in sets the token as an HttpOnly, SameSite=Strict
// cookie, which then authenticates; a bad token sets nothing.
func TestGuardLogin(t *testing.T) {
	t.Parallel()
	mux := http.NewServeMux()
	serve.Mount(mux, &greeter{}, greeterEndpoints)
	h := serve.Guard{Verifier: tokens{"rtd_v": {Name: "ann", Role: serve.RoleViewer}}}.Handler(mux)
	post := func(path, body string) *httptest.ResponseRecorder {
		req := httptest.NewRequest("POST", path, strings.NewReader(body))
		req.Header.Set("Content-Type", "application/json")
		rec := httptest.NewRecorder()
		h.ServeHTTP(rec, req)
		return rec
	}
	rec := post("/login", `{"token":"nope"}`)
	require.Equal(t, http.StatusUnauthorized, rec.Code)
	require.Empty(t, rec.Result().Cookies())

	rec = post("/login", `{"token":"norole"}`)
	require.Equal(t, http.StatusForbidden, rec.Code, "authenticated, but no role: nothing to sign in as")
	require.Contains(t, rec.Body.String(), "retryd_role")
	require.Empty(t, rec.Result().Cookies())

	rec = post("/login", `{"token":"rtd_v"}`)
	require.Equal(t, http.StatusOK, rec.Code, rec.Body.String())
	require.JSONEq(t, `{"name":"ann","role":"viewer"}`, rec.Body.String())
	cookies := rec.Result().Cookies()
	require.Len(t, cookies, 1)
	c := cookies[0]
	require.Equal(t, serve.SessionCookie, c.Name)
	require.True(t, c.HttpOnly)
	require.Equal(t, http.SameSiteStrictMode, c.SameSite)
	require.Equal(t, "/", c.Path)

	req := httptest.NewRequest("GET", "/v1/hello/ann", nil)
	req.AddCookie(c)
	rec = httptest.NewRecorder()
	h.ServeHTTP(rec, req)
	require.Equal(t, http.StatusOK, rec.Code)

	rec = post("/logout", "")
	require.Equal(t, http.StatusNoContent, rec.Code)
	require.Equal(t, -1, rec.Result().Cookies()[0].MaxAge)
}

// GET /v1/whoami: any valid token learns its name and role, and whether it
// came from the session cookie; no token is 401.
func TestWhoami(t *testing.T) {
	t.Parallel()
	h := serve.Guard{Verifier: tokens{"v": {Name: "ci-viewer", Role: serve.RoleViewer}, "p": {Name: "shop", Role: serve.RoleProducer}}}.
		Handler(serve.NewMux(nil, nil))
	do := func(auth, cookie string) *httptest.ResponseRecorder {
		req := httptest.NewRequest(http.MethodGet, serve.WhoamiPath, nil)
		if auth != "" {
			req.Header.Set("Authorization", auth)
		}
		if cookie != "" {
			req.AddCookie(&http.Cookie{Name: serve.SessionCookie, Value: cookie})
		}
		rec := httptest.NewRecorder()
		h.ServeHTTP(rec, req)
		return rec
	}
	rec := do("", "")
	require.Equal(t, http.StatusUnauthorized, rec.Code)
	require.Contains(t, rec.Header().Get("WWW-Authenticate"), "Bearer")
	require.Equal(t, http.StatusUnauthorized, do("Bearer nope", "").Code)
	require.Equal(t, http.StatusServiceUnavailable, do("Bearer broken", "").Code)
	require.Equal(t, http.StatusForbidden, do("Bearer norole", "").Code)
	require.JSONEq(t, `{"name":"shop","role":"producer","session":false}`, do("Bearer p", "").Body.String())
	require.JSONEq(t, `{"name":"ci-viewer","role":"viewer","session":true}`, do("", "v").Body.String())

	// Authentication off: the local admin, no session to end.
	rec = httptest.NewRecorder()
	serve.Guard{}.Handler(serve.NewMux(nil, nil)).ServeHTTP(rec, httptest.NewRequest(http.MethodGet, "http://localhost:8080"+serve.WhoamiPath, nil))
	require.JSONEq(t, `{"name":"local","role":"admin","session":false}`, rec.Body.String())
}
