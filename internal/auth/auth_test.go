package auth_test

import (
	"context"
	"encoding/json"
	"errors"
	"io"
	"net/http"
	"net/http/httptest"
	"os"
	"path/filepath"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/jackc/pgx/v5/pgxpool"
	"github.com/rs/zerolog"
	"github.com/stretchr/testify/require"

	"github.com/retryd/retryd/internal/auth"
	"github.com/retryd/retryd/internal/serve"
	"github.com/retryd/retryd/migrations/pgtest"
	"github.com/retryd/retryd/pkg/contract"
	"github.com/retryd/retryd/stores/pgdb"
)

func TestMain(m *testing.M) { pgtest.Main(m) }

// clock is a test clock.
type clock struct {
	mu  sync.Mutex
	now time.Time
}

func (c *clock) Now() time.Time { c.mu.Lock(); defer c.mu.Unlock(); return c.now }
func (c *clock) Add(d time.Duration) {
	c.mu.Lock()
	defer c.mu.Unlock()
	c.now = c.now.Add(d)
}

func TestTokenLifecycle(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	pool := pgtest.NewPool(t)
	store := auth.NewStore(pool)
	clk := &clock{now: time.Now()}
	v, err := auth.NewVerifier(auth.VerifierConfig{Store: store, Now: clk.Now})
	require.NoError(t, err)

	tok, secret, err := store.Create(ctx, "oncall", serve.RoleOperator, nil)
	require.NoError(t, err)
	require.True(t, strings.HasPrefix(secret, auth.Prefix))
	require.Equal(t, serve.RoleOperator, tok.Role)

	_, _, err = store.Create(ctx, "oncall", serve.RoleViewer, nil)
	require.ErrorIs(t, err, pgdb.ErrConflict, "two live tokens may not share a name")
	// A name is the by of its holder's lifecycle facts, which allow 64.
	_, _, err = store.Create(ctx, strings.Repeat("n", contract.MaxTokenLen+1), serve.RoleViewer, nil)
	require.ErrorIs(t, err, contract.ErrInvalid)

	var stored []byte
	require.NoError(t, pool.QueryRow(ctx, `SELECT hash FROM api_tokens WHERE id = $1`, tok.ID).Scan(&stored))
	require.NotContains(t, string(stored), secret[len(auth.Prefix):], "only the hash is stored")
	require.Len(t, stored, 32)

	p, err := v.Authenticate(ctx, secret)
	require.NoError(t, err)
	require.Equal(t, serve.Principal{Name: "oncall", Role: serve.RoleOperator}, p)

	lastUsed := func() *time.Time {
		var at *time.Time
		require.NoError(t, pool.QueryRow(ctx, `SELECT last_used_at FROM api_tokens WHERE id = $1`, tok.ID).Scan(&at))
		return at
	}
	first := lastUsed()
	require.NotNil(t, first, "the first use is recorded")
	clk.Add(10 * time.Second)
	_, err = v.Authenticate(ctx, secret)
	require.NoError(t, err)
	require.WithinDuration(t, *first, *lastUsed(), time.Millisecond, "at most once a minute")
	clk.Add(time.Minute)
	_, err = v.Authenticate(ctx, secret)
	require.NoError(t, err)
	require.True(t, lastUsed().After(*first))

	for _, bad := range []string{"", "nope", auth.Prefix + strings.Repeat("x", 40), secret + "x"} {
		_, err := v.Authenticate(ctx, bad)
		require.ErrorIs(t, err, serve.ErrBadCredential, bad)
	}

	// A revoke takes effect once the cache TTL passed, not before.
	_, err = store.Revoke(ctx, tok.ID)
	require.NoError(t, err)
	_, err = v.Authenticate(ctx, secret)
	require.NoError(t, err, "still cached")
	clk.Add(auth.DefaultCacheTTL)
	_, err = v.Authenticate(ctx, secret)
	require.ErrorIs(t, err, serve.ErrBadCredential)
	require.ErrorContains(t, err, "revoked")
	again, err := store.Revoke(ctx, tok.ID)
	require.NoError(t, err, "revoking twice is fine")
	require.NotNil(t, again.RevokedAt)
	_, err = store.Revoke(ctx, "01NOSUCHTOKEN")
	require.ErrorIs(t, err, pgdb.ErrNotFound)

	// The name is free again once revoked.
	exp := clk.Now().Add(time.Hour)
	tok2, secret2, err := store.Create(ctx, "oncall", serve.RoleViewer, &exp)
	require.NoError(t, err)
	_, err = v.Authenticate(ctx, secret2)
	require.NoError(t, err)
	clk.Add(time.Hour)
	_, err = v.Authenticate(ctx, secret2)
	require.ErrorIs(t, err, serve.ErrBadCredential)
	require.ErrorContains(t, err, "expired")

	list, err := store.List(ctx)
	require.NoError(t, err)
	require.Len(t, list, 2)
	require.Equal(t, tok2.ID, list[0].ID, "newest first")

	_, _, err = store.Create(ctx, "", serve.RoleViewer, nil)
	require.ErrorContains(t, err, "name")
	_, _, err = store.Create(ctx, "x", serve.RolePublic, nil)
	require.ErrorContains(t, err, "role")
	past := time.Now().Add(-time.Second)
	_, _, err = store.Create(ctx, "x", serve.RoleViewer, &past)
	require.ErrorContains(t, err, "expires_at")
}

func TestVerifierReportsAnOutage(t *testing.T) {
	t.Parallel()
	pool := pgtest.NewPool(t)
	v, err := auth.NewVerifier(auth.VerifierConfig{Store: auth.NewStore(pool)})
	require.NoError(t, err)
	secret, err := auth.NewSecret()
	require.NoError(t, err)
	pool.Close()
	_, err = v.Authenticate(context.Background(), secret)
	require.Error(t, err)
	require.False(t, errors.Is(err, serve.ErrBadCredential), "an outage is not a bad token (503, not 401)")
}

func TestBootstrapIsIdempotentAndRotates(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	pool := pgtest.NewPool(t)
	store := auth.NewStore(pool)
	s1, err := auth.NewSecret()
	require.NoError(t, err)
	var wg sync.WaitGroup
	errs := make([]error, 4)
	for i := range errs {
		wg.Go(func() { errs[i] = store.EnsureBootstrap(ctx, s1) })
	}
	wg.Wait()
	for _, err := range errs {
		require.NoError(t, err, "every service may ensure it at once")
	}
	live := func() []auth.Token {
		ts, err := store.List(ctx)
		require.NoError(t, err)
		var out []auth.Token
		for _, tk := range ts {
			if tk.RevokedAt == nil {
				out = append(out, tk)
			}
		}
		return out
	}
	require.Len(t, live(), 1)
	require.Equal(t, auth.BootstrapName, live()[0].Name)
	require.Equal(t, serve.RoleAdmin, live()[0].Role)

	s2, err := auth.NewSecret()
	require.NoError(t, err)
	require.NoError(t, store.EnsureBootstrap(ctx, s2))
	v, err := auth.NewVerifier(auth.VerifierConfig{Store: store})
	require.NoError(t, err)
	_, err = v.Authenticate(ctx, s1)
	require.ErrorIs(t, err, serve.ErrBadCredential, "a rotated secret is revoked")
	_, err = v.Authenticate(ctx, s2)
	require.NoError(t, err)
	require.ErrorContains(t, store.EnsureBootstrap(ctx, s1), "revoked", "a revoked secret does not come back")
	require.ErrorContains(t, store.EnsureBootstrap(ctx, "short"), "must start with")
}

func TestFromEnv(t *testing.T) {
	t.Parallel()
	env := func(kv map[string]string) func(string) string { return func(k string) string { return kv[k] } }
	c, err := auth.FromEnv(env(nil))
	require.NoError(t, err)
	require.Equal(t, auth.ModeTokens, c.Mode, "tokens by default")
	require.Equal(t, serve.RolePublic, c.MetricsRole)

	secret, err := auth.NewSecret()
	require.NoError(t, err)
	file := filepath.Join(t.TempDir(), "admin")
	require.NoError(t, os.WriteFile(file, []byte(secret+"\n"), 0o600))
	c, err = auth.FromEnv(env(map[string]string{"RETRYD_ADMIN_TOKEN_FILE": file, "RETRYD_METRICS_ROLE": "viewer", "RETRYD_AUTH": "off"}))
	require.NoError(t, err)
	require.Equal(t, secret, c.AdminToken)
	require.Equal(t, auth.EnvAdminTokenFile, c.AdminTokenFrom, "where the secret came from, to name rather than print")
	require.Equal(t, serve.RoleViewer, c.MetricsRole)
	require.Equal(t, auth.ModeOff, c.Mode)
	c, err = auth.FromEnv(env(map[string]string{"RETRYD_ADMIN_TOKEN": secret}))
	require.NoError(t, err)
	require.Equal(t, auth.EnvAdminToken, c.AdminTokenFrom)

	_, err = auth.FromEnv(env(map[string]string{"RETRYD_AUTH": "none", "RETRYD_ADMIN_TOKEN": "short", "RETRYD_METRICS_ROLE": "root", "RETRYD_AUTH_CACHE_TTL": "1h"}))
	for _, name := range []string{"RETRYD_AUTH=", "RETRYD_ADMIN_TOKEN:", "RETRYD_METRICS_ROLE:", "RETRYD_AUTH_CACHE_TTL="} {
		require.ErrorContains(t, err, name)
	}

	off := auth.Config{Mode: auth.ModeOff}
	require.NoError(t, off.Validate("127.0.0.1:8080", "[::1]:9"))
	err = off.Validate("127.0.0.1:8080", ":8081")
	require.ErrorContains(t, err, `RETRYD_AUTH=off is only allowed when every listener is loopback, but ":8081" is not`)
	_, _, err = off.Guard(context.Background(), nil, zerolog.Nop(), "0.0.0.0:80")
	require.Error(t, err)
	g, _, err := off.Guard(context.Background(), nil, zerolog.Nop(), "127.0.0.1:80")
	require.NoError(t, err)
	require.Nil(t, g.Verifier)
}

// The token routes: admin only, the secret shown once, never listed.
func TestTokenAPI(t *testing.T) {
	t.Parallel()
	srv, admin := tokenServer(t, pgtest.NewPool(t), auth.OIDCConfig{}, nil)
	call := func(method, path, token, body string) (int, map[string]any) {
		code, raw := request(t, srv, method, path, token, body)
		var out map[string]any
		_ = json.Unmarshal([]byte(raw), &out)
		return code, out
	}
	code, _ := call("GET", "/v1/tokens", "", "")
	require.Equal(t, http.StatusUnauthorized, code)
	code, created := call("POST", "/v1/tokens", admin, `{"name":"ci","role":"viewer"}`)
	require.Equal(t, http.StatusCreated, code, created)
	viewer := created["token"].(string)
	require.True(t, strings.HasPrefix(viewer, auth.Prefix))
	require.Equal(t, "viewer", created["role"])

	code, _ = call("GET", "/v1/tokens", viewer, "")
	require.Equal(t, http.StatusForbidden, code, "a viewer may not list tokens")
	code, body := call("POST", "/v1/tokens", admin, `{"name":"x","role":"root"}`)
	require.Equal(t, http.StatusBadRequest, code)
	require.Equal(t, "role", body["error"].(map[string]any)["field"])

	code, list := call("GET", "/v1/tokens", admin, "")
	require.Equal(t, http.StatusOK, code)
	raw, _ := json.Marshal(list)
	require.NotContains(t, string(raw), viewer[len(auth.Prefix):], "a list never shows a secret")
	require.Len(t, list["tokens"], 2, "bootstrap and ci")

	code, revoked := call("DELETE", "/v1/tokens/"+created["id"].(string), admin, "")
	require.Equal(t, http.StatusOK, code)
	require.NotNil(t, revoked["revoked_at"])
	code, _ = call("DELETE", "/v1/tokens/nosuch", admin, "")
	require.Equal(t, http.StatusNotFound, code)
}

// With authentication off, POST /v1/tokens is refused and creates
// nothing: a token made then would outlive the mode, letting whoever
// reached the loopback API in once tokens are on. Listing and revoking
// stay.
func TestTokenCreateRefusedWithAuthOff(t *testing.T) {
	t.Parallel()
	pool := pgtest.NewPool(t)
	guard, store, err := auth.Config{Mode: auth.ModeOff}.Guard(context.Background(), pool, zerolog.Nop(), "127.0.0.1:0")
	require.NoError(t, err)
	mux := serve.NewMux(nil, nil)
	auth.NewAPI(store).Register(mux)
	srv := httptest.NewServer(guard.Handler(mux))
	t.Cleanup(srv.Close)

	code, body := request(t, srv, "POST", "/v1/tokens", "", `{"name":"rebind-admin","role":"admin"}`)
	require.Equal(t, http.StatusForbidden, code, body)
	require.Contains(t, body, `"code":"forbidden"`)
	require.Contains(t, body, "tokens can only be created with RETRYD_AUTH=tokens")
	require.Zero(t, pgtest.Count(t, pool, `SELECT count(*) FROM api_tokens`))
	require.Zero(t, pgtest.Count(t, pool, `SELECT count(*) FROM audit_log`))

	tok, _, err := store.Create(context.Background(), "made-with-tokens", serve.RoleViewer, nil)
	require.NoError(t, err)
	code, body = request(t, srv, "GET", "/v1/tokens", "", "")
	require.Equal(t, http.StatusOK, code, body)
	require.Contains(t, body, "made-with-tokens")
	code, body = request(t, srv, "DELETE", "/v1/tokens/"+tok.ID, "", "")
	require.Equal(t, http.StatusOK, code, body)
}

// tokenServer serves the token API and the routes routes adds (when not
// nil) behind the guard of auth.Config in tokens mode, with oc and a new
// admin token, on pool. It returns the server, closed at cleanup, and
// the admin token.
func tokenServer(t *testing.T, pool *pgxpool.Pool, oc auth.OIDCConfig, routes func(*http.ServeMux)) (*httptest.Server, string) {
	t.Helper()
	admin, err := auth.NewSecret()
	require.NoError(t, err)
	guard, store, err := auth.Config{Mode: auth.ModeTokens, AdminToken: admin, OIDC: oc}.Guard(context.Background(), pool, zerolog.Nop(), ":0")
	require.NoError(t, err)
	mux := serve.NewMux(nil, nil)
	auth.NewAPI(store).Register(mux)
	if routes != nil {
		routes(mux)
	}
	srv := httptest.NewServer(guard.Handler(mux))
	t.Cleanup(srv.Close)
	return srv, admin
}

// request sends a request to srv with token as its bearer token and body
// as its JSON body (neither when empty), and returns the status and the
// body of the answer.
func request(t *testing.T, srv *httptest.Server, method, path, token, body string) (int, string) {
	t.Helper()
	req, err := http.NewRequestWithContext(context.Background(), method, srv.URL+path, strings.NewReader(body))
	require.NoError(t, err)
	if token != "" {
		req.Header.Set("Authorization", "Bearer "+token)
	}
	if body != "" {
		req.Header.Set("Content-Type", "application/json")
	}
	resp, err := srv.Client().Do(req)
	require.NoError(t, err)
	defer resp.Body.Close()
	raw, err := io.ReadAll(resp.Body)
	require.NoError(t, err)
	return resp.StatusCode, string(raw)
}
