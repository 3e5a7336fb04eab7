package auth

import (
	"context"
	"errors"
	"fmt"
	"os"
	"strings"
	"time"

	"github.com/jackc/pgx/v5/pgxpool"
	"github.com/rs/zerolog"

	"github.com/retryd/retryd/internal/serve"
)

// Environment variables every binary with an HTTP API reads.
const (
	EnvMode           = "RETRYD_AUTH"
	EnvAdminToken     = "RETRYD_ADMIN_TOKEN"
	EnvAdminTokenFile = "RETRYD_ADMIN_TOKEN_FILE"
	EnvMetricsRole    = "RETRYD_METRICS_ROLE"
	EnvCacheTTL       = "RETRYD_AUTH_CACHE_TTL"
	// OIDC bearer tokens (off without an issuer); see OIDCConfig.
	EnvOIDCIssuer    = "RETRYD_OIDC_ISSUER"
	EnvOIDCAudience  = "RETRYD_OIDC_AUDIENCE"
	EnvOIDCJWKSURL   = "RETRYD_OIDC_JWKS_URL"
	EnvOIDCRoleClaim = "RETRYD_OIDC_ROLE_CLAIM"
	EnvOIDCNameClaim = "RETRYD_OIDC_NAME_CLAIM"
)

// Mode is RETRYD_AUTH.
type Mode string

// Modes.
const (
	// ModeTokens checks a bearer token on every route but the public ones.
	ModeTokens Mode = "tokens"
	// ModeOff lets every request act as admin. Only on loopback listeners.
	ModeOff Mode = "off"
)

// Config is how a binary authenticates its HTTP API.
type Config struct {
	// Mode: ModeTokens when empty.
	Mode Mode
	// AdminToken, when set, is ensured as the live admin token named
	// "bootstrap" at start (Store.EnsureBootstrap).
	AdminToken string
	// AdminTokenFrom names where FromEnv read AdminToken
	// (RETRYD_ADMIN_TOKEN or RETRYD_ADMIN_TOKEN_FILE; empty: not from the
	// environment), so a banner can say where the secret is rather than
	// print it.
	AdminTokenFrom string
	// MetricsRole is what GET /metrics needs; RolePublic when zero.
	MetricsRole serve.Role
	// CacheTTL bounds how long a revoked token keeps working
	// (DefaultCacheTTL when zero).
	CacheTTL time.Duration
	// OIDC, when enabled, accepts JWTs from an OpenID Connect issuer
	// besides API tokens.
	OIDC OIDCConfig
}

// FromEnv reads RETRYD_AUTH, RETRYD_ADMIN_TOKEN or RETRYD_ADMIN_TOKEN_FILE,
// RETRYD_METRICS_ROLE, RETRYD_AUTH_CACHE_TTL and the RETRYD_OIDC_*
// settings with getenv (os.Getenv when nil). Errors name the variable.
// Every binary with an HTTP API builds its Guard from this (Config.Guard).
func FromEnv(getenv func(string) string) (Config, error) {
	if getenv == nil {
		getenv = os.Getenv
	}
	var c Config
	var errs []error
	switch m := Mode(strings.TrimSpace(getenv(EnvMode))); m {
	case "", ModeTokens:
		c.Mode = ModeTokens
	case ModeOff:
		c.Mode = ModeOff
	default:
		errs = append(errs, fmt.Errorf("%s=%q: want tokens or off", EnvMode, m))
	}
	tok, file := getenv(EnvAdminToken), getenv(EnvAdminTokenFile)
	switch {
	case tok != "" && file != "":
		errs = append(errs, fmt.Errorf("%s and %s are both set: set one", EnvAdminToken, EnvAdminTokenFile))
	case file != "":
		b, err := os.ReadFile(file)
		if err != nil {
			errs = append(errs, fmt.Errorf("%s: %w", EnvAdminTokenFile, err))
		}
		c.AdminToken = strings.TrimSpace(string(b))
	default:
		c.AdminToken = strings.TrimSpace(tok)
	}
	if c.AdminToken != "" {
		c.AdminTokenFrom = adminTokenVar(tok)
	}
	if c.AdminToken != "" && !wellFormed(c.AdminToken) {
		errs = append(errs, fmt.Errorf("%s: the admin token must start with %q and be at least %d characters (e.g. \"rtd_$(openssl rand -hex 32)\")",
			adminTokenVar(tok), Prefix, minTokenLen))
	}
	c.MetricsRole = serve.RolePublic
	if s := strings.TrimSpace(getenv(EnvMetricsRole)); s != "" {
		r, err := serve.ParseRole(s)
		if err != nil {
			errs = append(errs, fmt.Errorf("%s: %w", EnvMetricsRole, err))
		}
		c.MetricsRole = r
	}
	if s := strings.TrimSpace(getenv(EnvCacheTTL)); s != "" {
		d, err := time.ParseDuration(s)
		if err != nil || d <= 0 || d > time.Minute {
			errs = append(errs, fmt.Errorf("%s=%q: want a duration from 1ms to 1m", EnvCacheTTL, s))
		}
		c.CacheTTL = d
	}
	var oidcErrs []error
	c.OIDC, oidcErrs = oidcFromEnv(getenv)
	errs = append(errs, oidcErrs...)
	return c, errors.Join(errs...)
}

func adminTokenVar(tok string) string {
	if tok != "" {
		return EnvAdminToken
	}
	return EnvAdminTokenFile
}

// Validate refuses authentication off on a listener that is not loopback:
// the error names RETRYD_AUTH and the address.
func (c Config) Validate(listeners ...string) error {
	if c.Mode != ModeOff {
		return nil
	}
	for _, l := range listeners {
		if !serve.IsLoopback(l) {
			return fmt.Errorf("%s=off is only allowed when every listener is loopback, but %q is not: listen on 127.0.0.1 or set %s=tokens", EnvMode, l, EnvMode)
		}
	}
	return nil
}

// Guard validates c for the listeners, ensures the bootstrap admin token
// and returns the serve.Guard to put in front of the binary's mux, and the
// token store (nil without a pool), for the token routes. pool may be nil
// only with authentication off.
func (c Config) Guard(ctx context.Context, pool *pgxpool.Pool, log zerolog.Logger, listeners ...string) (serve.Guard, *Store, error) {
	if err := c.Validate(listeners...); err != nil {
		return serve.Guard{}, nil, err
	}
	var store *Store
	if pool != nil {
		store = NewStore(pool)
	}
	if c.Mode == ModeOff {
		log.Warn().Strs("listeners", listeners).
			Msg("AUTHENTICATION IS OFF (RETRYD_AUTH=off): every request on these loopback listeners acts as admin")
		if c.OIDC.Enabled() {
			log.Warn().Msg("RETRYD_OIDC_ISSUER is ignored: authentication is off")
		}
		return serve.Guard{MetricsRole: c.MetricsRole}, store, nil
	}
	if pool == nil {
		return serve.Guard{}, nil, fmt.Errorf("%s=tokens needs Postgres to check tokens", EnvMode)
	}
	if c.AdminToken != "" {
		if err := store.EnsureBootstrap(ctx, c.AdminToken); err != nil {
			return serve.Guard{}, nil, err
		}
		log.Info().Str("name", BootstrapName).Msg("bootstrap admin token ensured")
	}
	v, err := NewVerifier(VerifierConfig{Store: store, CacheTTL: c.CacheTTL, Logger: log.With().Str("component", "auth").Logger()})
	if err != nil {
		return serve.Guard{}, nil, err
	}
	if !c.OIDC.Enabled() {
		return serve.Guard{Verifier: v, MetricsRole: c.MetricsRole}, store, nil
	}
	ov, err := NewOIDCVerifier(c.OIDC, log.With().Str("component", "oidc").Logger(), nil)
	if err != nil {
		return serve.Guard{}, nil, err
	}
	log.Info().Str("issuer", c.OIDC.Issuer).Str("audience", c.OIDC.Audience).Str("role_claim", c.OIDC.RoleClaim).
		Msg("OIDC bearer tokens accepted besides API tokens")
	return serve.Guard{Verifier: bearers{tokens: v, oidc: ov}, MetricsRole: c.MetricsRole}, store, nil
}

// bearers sends a bearer shaped like a JWT (three dot-separated parts) to
// OIDC and anything else to the API tokens: an API token (rtd_ and
// base64url) never has a dot, so neither path sees the other's tokens.
type bearers struct {
	tokens, oidc serve.Authenticator
}

func (b bearers) Authenticate(ctx context.Context, token string) (serve.Principal, error) {
	if strings.Count(token, ".") == 2 {
		return b.oidc.Authenticate(ctx, token)
	}
	return b.tokens.Authenticate(ctx, token)
}
