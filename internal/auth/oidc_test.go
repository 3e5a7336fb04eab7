package auth_test

import (
	"context"
	"crypto/rand"
	"crypto/rsa"
	"encoding/json"
	"net/http"
	"net/http/httptest"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/go-jose/go-jose/v4"
	"github.com/rs/zerolog"
	"github.com/stretchr/testify/require"

	"github.com/retryd/retryd/internal/auth"
	"github.com/retryd/retryd/internal/serve"
	"github.com/retryd/retryd/migrations/pgtest"
)

// issuer is an OpenID Connect issuer for tests: a discovery document, a
// JWKS with one RSA key, and tokens signed by it (or by another key).
type issuer struct {
	srv       *httptest.Server
	key       *rsa.PrivateKey // kid k1
	down      atomic.Bool     // discovery answers 503
	discovery atomic.Int32
	keyFetch  atomic.Int32

	mu   sync.Mutex
	jwks map[string]*rsa.PublicKey // what /keys serves, by kid
}

// publish sets the keys /keys serves.
func (iss *issuer) publish(keys map[string]*rsa.PublicKey) {
	iss.mu.Lock()
	defer iss.mu.Unlock()
	iss.jwks = keys
}

const testAudience = "retryd-api"

func newIssuer(t *testing.T) *issuer {
	t.Helper()
	iss := &issuer{key: newKey(t)}
	iss.publish(map[string]*rsa.PublicKey{"k1": &iss.key.PublicKey})
	mux := http.NewServeMux()
	mux.HandleFunc("GET /.well-known/openid-configuration", func(w http.ResponseWriter, r *http.Request) {
		iss.discovery.Add(1)
		if iss.down.Load() {
			http.Error(w, "down", http.StatusServiceUnavailable)
			return
		}
		serve.WriteJSON(w, http.StatusOK, map[string]any{
			"issuer": iss.srv.URL, "jwks_uri": iss.srv.URL + "/keys",
			"id_token_signing_alg_values_supported": []string{"RS256"},
		})
	})
	mux.HandleFunc("GET /keys", func(w http.ResponseWriter, r *http.Request) {
		iss.keyFetch.Add(1)
		iss.mu.Lock()
		set := jose.JSONWebKeySet{Keys: []jose.JSONWebKey{
			// Skipped: an encryption key and a symmetric key.
			{Key: &newKey(t).PublicKey, KeyID: "enc", Algorithm: string(jose.RSA_OAEP), Use: "enc"},
			{Key: []byte("not a signing key"), KeyID: "k1", Algorithm: string(jose.HS256)},
		}}
		for kid, pub := range iss.jwks {
			set.Keys = append(set.Keys, jose.JSONWebKey{Key: pub, KeyID: kid, Algorithm: string(jose.RS256), Use: "sig"})
		}
		iss.mu.Unlock()
		serve.WriteJSON(w, http.StatusOK, set)
	})
	iss.srv = httptest.NewServer(mux)
	t.Cleanup(iss.srv.Close)
	return iss
}

func newKey(t *testing.T) *rsa.PrivateKey {
	t.Helper()
	k, err := rsa.GenerateKey(rand.Reader, 2048)
	require.NoError(t, err)
	return k
}

// claims are a valid token's: this issuer, the audience, sub alice, an
// hour to live, role operator; edit sets or (with nil) deletes claims.
func (iss *issuer) claims(edit map[string]any) map[string]any {
	c := map[string]any{
		"iss": iss.srv.URL, "aud": testAudience, "sub": "alice",
		"iat": time.Now().Unix(), "exp": time.Now().Add(time.Hour).Unix(),
		auth.DefaultRoleClaim: "operator",
	}
	for k, v := range edit {
		if v == nil {
			delete(c, k)
		} else {
			c[k] = v
		}
	}
	return c
}

func sign(t *testing.T, key *rsa.PrivateKey, claims map[string]any) string {
	t.Helper()
	return signKid(t, key, "k1", claims)
}

func signKid(t *testing.T, key *rsa.PrivateKey, kid string, claims map[string]any) string {
	t.Helper()
	signer, err := jose.NewSigner(jose.SigningKey{Algorithm: jose.RS256, Key: key},
		(&jose.SignerOptions{}).WithType("JWT").WithHeader("kid", kid))
	require.NoError(t, err)
	payload, err := json.Marshal(claims)
	require.NoError(t, err)
	jws, err := signer.Sign(payload)
	require.NoError(t, err)
	tok, err := jws.CompactSerialize()
	require.NoError(t, err)
	return tok
}

// A server with a guard from Config.Guard (API tokens and OIDC), an
// operator route, an admin route (the token list) and whoami.
func oidcServer(t *testing.T, iss *issuer, oc auth.OIDCConfig) (call func(method, path, token string) (int, string), admin string) {
	t.Helper()
	srv, admin := tokenServer(t, pgtest.NewPool(t), oc, func(mux *http.ServeMux) {
		mux.Handle("POST /v1/act", serve.Require(serve.RoleOperator, http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
			serve.WriteJSON(w, http.StatusOK, map[string]string{"by": serve.Actor(r)})
		})))
	})
	return func(method, path, token string) (int, string) {
		return request(t, srv, method, path, token, "")
	}, admin
}

func TestOIDCBearer(t *testing.T) {
	t.Parallel()
	iss := newIssuer(t)
	call, admin := oidcServer(t, iss, auth.OIDCConfig{Issuer: iss.srv.URL, Audience: testAudience})

	operator := sign(t, iss.key, iss.claims(nil))
	code, body := call("POST", "/v1/act", operator)
	require.Equal(t, http.StatusOK, code, body)
	require.JSONEq(t, `{"by":"oidc:alice"}`, body, "the principal is oidc:<sub>")
	code, body = call("GET", "/v1/tokens", operator)
	require.Equal(t, http.StatusForbidden, code, "an operator may not use an admin route: %s", body)
	require.Contains(t, body, `\"oidc:alice\" has role operator`)
	code, body = call("GET", serve.WhoamiPath, operator)
	require.Equal(t, http.StatusOK, code)
	require.JSONEq(t, `{"name":"oidc:alice","role":"operator","session":false}`, body)

	for name, tc := range map[string]struct {
		token string
		code  int
		says  string
	}{
		"expired":        {sign(t, iss.key, iss.claims(map[string]any{"exp": time.Now().Add(-time.Minute).Unix()})), 401, "expired"},
		"wrong audience": {sign(t, iss.key, iss.claims(map[string]any{"aud": "another-api"})), 401, "audience"},
		"wrong issuer":   {sign(t, iss.key, iss.claims(map[string]any{"iss": "https://elsewhere.example"})), 401, "different provider"},
		"another key":    {sign(t, newKey(t), iss.claims(nil)), 401, "signature"},
		"no sub":         {sign(t, iss.key, iss.claims(map[string]any{"sub": nil})), 401, `claim \"sub\"`},
		"long sub":       {sign(t, iss.key, iss.claims(map[string]any{"sub": strings.Repeat("a", 60)})), 401, "at most 59 bytes"},
		"too long":       {sign(t, iss.key, iss.claims(map[string]any{"pad": strings.Repeat("x", auth.MaxBearerLen)})), 401, "longer than"},
		"not a JWT":      {"a.b.c", 401, "malformed"},
		"no role claim":  {sign(t, iss.key, iss.claims(map[string]any{auth.DefaultRoleClaim: nil})), 403, `claim \"retryd_role\" names no retryd role`},
		"unknown role":   {sign(t, iss.key, iss.claims(map[string]any{auth.DefaultRoleClaim: "root"})), 403, `claim \"retryd_role\"`},
		"public role":    {sign(t, iss.key, iss.claims(map[string]any{auth.DefaultRoleClaim: "public"})), 403, `claim \"retryd_role\"`},
	} {
		code, body := call("POST", "/v1/act", tc.token)
		require.Equal(t, tc.code, code, "%s: %s", name, body)
		require.Contains(t, body, tc.says, name)
		if code == http.StatusForbidden {
			require.Contains(t, body, `"code":"forbidden"`, name)
		}
	}

	// An array of roles: the highest counts; other strings are skipped.
	many := sign(t, iss.key, iss.claims(map[string]any{auth.DefaultRoleClaim: []string{"viewer", "staff", "admin", "operator"}}))
	code, body = call("GET", "/v1/tokens", many)
	require.Equal(t, http.StatusOK, code, body)

	// API tokens work alongside.
	code, body = call("GET", "/v1/tokens", admin)
	require.Equal(t, http.StatusOK, code, body)
	code, _ = call("GET", "/v1/tokens", "rtd_nosuch")
	require.Equal(t, http.StatusUnauthorized, code)

	// Discovery once, the JWKS once: a forged token naming a held key
	// fetches nothing.
	require.EqualValues(t, 1, iss.discovery.Load())
	require.EqualValues(t, 1, iss.keyFetch.Load())
}

// Key rotation: a key the issuer adds is fetched for the first token
// naming it, a key it removes stops verifying within an hour, and forged
// tokens naming unknown keys fetch at most once per 10 s.
func TestOIDCKeyRotation(t *testing.T) {
	t.Parallel()
	iss := newIssuer(t)
	clk := &clock{now: time.Now()}
	v, err := auth.NewOIDCVerifier(auth.OIDCConfig{Issuer: iss.srv.URL, Audience: testAudience}, zerolog.Nop(), clk.Now)
	require.NoError(t, err)
	ctx := context.Background()
	claims := iss.claims(map[string]any{"exp": time.Now().Add(3 * time.Hour).Unix()})
	accept := func(tok, why string) {
		t.Helper()
		_, err := v.Authenticate(ctx, tok)
		require.NoError(t, err, why)
	}
	refuse := func(tok, why string) {
		t.Helper()
		_, err := v.Authenticate(ctx, tok)
		require.ErrorIs(t, err, serve.ErrBadCredential, why)
	}
	k1 := sign(t, iss.key, claims)
	accept(k1, "k1")
	require.EqualValues(t, 1, iss.keyFetch.Load())

	other := newKey(t)
	for range 5 {
		refuse(sign(t, other, claims), "forged, naming k1")
		refuse(signKid(t, other, "zz", claims), "forged, naming an unknown key")
	}
	require.EqualValues(t, 1, iss.keyFetch.Load(), "within 10 s of the last fetch nothing is fetched")
	clk.Add(11 * time.Second)
	for range 5 {
		refuse(signKid(t, other, "zz", claims), "forged, naming an unknown key")
	}
	require.EqualValues(t, 2, iss.keyFetch.Load(), "one fetch per 10 s, however many tokens")

	// The issuer adds k2 and signs with it.
	k2key := newKey(t)
	iss.publish(map[string]*rsa.PublicKey{"k1": &iss.key.PublicKey, "k2": &k2key.PublicKey})
	clk.Add(11 * time.Second)
	accept(signKid(t, k2key, "k2", claims), "a new key is fetched for the first token naming it")
	require.EqualValues(t, 3, iss.keyFetch.Load())
	accept(k1, "k1 still published")

	// The issuer removes k1: it stops verifying once the keys are an hour
	// old.
	iss.publish(map[string]*rsa.PublicKey{"k2": &k2key.PublicKey})
	accept(k1, "held for now")
	clk.Add(time.Hour)
	refuse(k1, "k1 removed")
	accept(signKid(t, k2key, "k2", claims), "k2")
	require.EqualValues(t, 4, iss.keyFetch.Load())
}

// A JWKS URL skips discovery, so the binary needs nothing from the issuer
// before the first token; a custom claim names the principal.
func TestOIDCJWKSURLAndClaims(t *testing.T) {
	t.Parallel()
	iss := newIssuer(t)
	call, _ := oidcServer(t, iss, auth.OIDCConfig{
		Issuer: iss.srv.URL, Audience: testAudience, JWKSURL: iss.srv.URL + "/keys",
		RoleClaim: "groups", NameClaim: "email",
	})
	tok := sign(t, iss.key, iss.claims(map[string]any{"groups": []string{"producer"}, "email": "shop@example.com"}))
	code, body := call("GET", serve.WhoamiPath, tok)
	require.Equal(t, http.StatusOK, code, body)
	require.JSONEq(t, `{"name":"oidc:shop@example.com","role":"producer","session":false}`, body)
	require.Zero(t, iss.discovery.Load())
}

// The issuer down at the first JWT: 503 (an outage, not the caller's
// fault), remembered rather than asked again by every request; API
// tokens are unaffected.
func TestOIDCDiscoveryDown(t *testing.T) {
	t.Parallel()
	iss := newIssuer(t)
	iss.down.Store(true)
	call, admin := oidcServer(t, iss, auth.OIDCConfig{Issuer: iss.srv.URL, Audience: testAudience})
	tok := sign(t, iss.key, iss.claims(nil))
	for range 3 {
		code, body := call("POST", "/v1/act", tok)
		require.Equal(t, http.StatusServiceUnavailable, code, body)
		require.Contains(t, body, serve.CodeAuthUnavailable)
	}
	require.EqualValues(t, 1, iss.discovery.Load(), "a failed discovery is retried after a while, not per request")
	code, _ := call("GET", "/v1/tokens", admin)
	require.Equal(t, http.StatusOK, code)
}

// A failed discovery is retried once discoveryRetry passed.
func TestOIDCDiscoveryRetried(t *testing.T) {
	t.Parallel()
	iss := newIssuer(t)
	iss.down.Store(true)
	clk := &clock{now: time.Now()}
	v, err := auth.NewOIDCVerifier(auth.OIDCConfig{Issuer: iss.srv.URL, Audience: testAudience}, zerolog.Nop(), clk.Now)
	require.NoError(t, err)
	ctx := context.Background()
	tok := sign(t, iss.key, iss.claims(nil))
	_, err = v.Authenticate(ctx, tok)
	require.Error(t, err)
	require.NotErrorIs(t, err, serve.ErrBadCredential)
	iss.down.Store(false)
	_, err = v.Authenticate(ctx, tok)
	require.Error(t, err, "still remembered")
	clk.Add(11 * time.Second)
	p, err := v.Authenticate(ctx, tok)
	require.NoError(t, err)
	require.Equal(t, serve.Principal{Name: "oidc:alice", Role: serve.RoleOperator}, p)
	require.EqualValues(t, 2, iss.discovery.Load())
}

func TestOIDCFromEnv(t *testing.T) {
	t.Parallel()
	env := func(kv map[string]string) func(string) string { return func(k string) string { return kv[k] } }
	c, err := auth.FromEnv(env(nil))
	require.NoError(t, err)
	require.False(t, c.OIDC.Enabled(), "off without an issuer")

	c, err = auth.FromEnv(env(map[string]string{"RETRYD_OIDC_ISSUER": "https://id.example.com", "RETRYD_OIDC_AUDIENCE": "retryd"}))
	require.NoError(t, err)
	require.Equal(t, auth.OIDCConfig{Issuer: "https://id.example.com", Audience: "retryd", RoleClaim: "retryd_role", NameClaim: "sub"}, c.OIDC)

	_, err = auth.FromEnv(env(map[string]string{"RETRYD_OIDC_ISSUER": "https://id.example.com"}))
	require.ErrorContains(t, err, "RETRYD_OIDC_AUDIENCE is required with RETRYD_OIDC_ISSUER")

	_, err = auth.FromEnv(env(map[string]string{"RETRYD_OIDC_AUDIENCE": "retryd"}))
	require.ErrorContains(t, err, "RETRYD_OIDC_AUDIENCE is set but RETRYD_OIDC_ISSUER is not")

	_, err = auth.FromEnv(env(map[string]string{"RETRYD_OIDC_ISSUER": "http://id.example.com", "RETRYD_OIDC_AUDIENCE": "retryd", "RETRYD_OIDC_JWKS_URL": "keys"}))
	require.ErrorContains(t, err, "RETRYD_OIDC_ISSUER: \"http://id.example.com\": want https")
	require.ErrorContains(t, err, "RETRYD_OIDC_JWKS_URL: \"keys\" is not an absolute URL")

	_, err = auth.FromEnv(env(map[string]string{"RETRYD_OIDC_ISSUER": "http://127.0.0.1:9999", "RETRYD_OIDC_AUDIENCE": "retryd"}))
	require.NoError(t, err, "plain http to a loopback issuer is fine (development)")
}

// An API token may not take a name an OIDC principal has.
func TestTokenNameNotOIDC(t *testing.T) {
	t.Parallel()
	_, _, err := auth.NewStore(pgtest.NewPool(t)).Create(context.Background(), "oidc:alice", serve.RoleAdmin, nil)
	require.ErrorContains(t, err, `must not start with "oidc:"`)
}

// No keys to be had at the first token is an outage (503), not a bad
// token.
func TestOIDCKeysUnavailable(t *testing.T) {
	t.Parallel()
	iss := newIssuer(t)
	v, err := auth.NewOIDCVerifier(auth.OIDCConfig{Issuer: iss.srv.URL, Audience: testAudience, JWKSURL: iss.srv.URL + "/nosuch"}, zerolog.Nop(), nil)
	require.NoError(t, err)
	_, err = v.Authenticate(context.Background(), sign(t, iss.key, iss.claims(nil)))
	require.ErrorContains(t, err, "404")
	require.NotErrorIs(t, err, serve.ErrBadCredential)
}
