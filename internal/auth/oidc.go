package auth

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"net/http"
	"strings"
	"sync"
	"time"
	"unicode"

	"github.com/coreos/go-oidc/v3/oidc"
	"github.com/rs/zerolog"

	"github.com/retryd/retryd/internal/serve"
	"github.com/retryd/retryd/pkg/contract"
)

// Defaults and bounds of OIDC bearer tokens.
const (
	DefaultRoleClaim = "retryd_role"
	DefaultNameClaim = "sub"
	// OIDCPrefix starts the principal name of an OIDC token, so audit
	// records and `by` cannot confuse it with an API token's name (API
	// token names may not start with it).
	OIDCPrefix = "oidc:"
	// MaxBearerLen bounds the bearer a JWT is parsed from: a request cannot
	// make the verifier decode and hash megabytes.
	MaxBearerLen = 8 << 10
	// discoveryTimeout bounds one fetch of the discovery document or JWKS.
	discoveryTimeout = 10 * time.Second
	// discoveryRetry is how long a failed discovery is remembered: while
	// the issuer is down, JWTs get 503 without each one asking it again.
	discoveryRetry = 10 * time.Second
	// maxDocument bounds a discovery document or JWKS read from the issuer.
	maxDocument = 1 << 20
)

// OIDCConfig is how bearer JWTs from an OpenID Connect issuer are
// accepted. The zero value (no Issuer) turns them off.
type OIDCConfig struct {
	// Issuer is the issuer URL: tokens' iss must equal it, and its
	// discovery document names the JWKS unless JWKSURL does.
	Issuer string
	// Audience is the aud a token must carry (required with Issuer).
	Audience string
	// JWKSURL, when set, is used instead of discovery, so a binary does
	// not need the issuer to answer a discovery request first.
	JWKSURL string
	// RoleClaim names the claim holding the retryd role (a string or an
	// array of strings): DefaultRoleClaim when empty.
	RoleClaim string
	// NameClaim names the claim whose string value, after OIDCPrefix, is
	// the principal's name: DefaultNameClaim when empty.
	NameClaim string
}

// Enabled reports whether JWTs are accepted.
func (c OIDCConfig) Enabled() bool { return c.Issuer != "" }

func oidcFromEnv(getenv func(string) string) (OIDCConfig, []error) {
	c := OIDCConfig{
		Issuer:    strings.TrimSpace(getenv(EnvOIDCIssuer)),
		Audience:  strings.TrimSpace(getenv(EnvOIDCAudience)),
		JWKSURL:   strings.TrimSpace(getenv(EnvOIDCJWKSURL)),
		RoleClaim: strings.TrimSpace(getenv(EnvOIDCRoleClaim)),
		NameClaim: strings.TrimSpace(getenv(EnvOIDCNameClaim)),
	}
	var errs []error
	if c.Issuer == "" {
		// Settings without an issuer would look like OIDC is on when it
		// is not.
		for name, v := range map[string]string{EnvOIDCAudience: c.Audience, EnvOIDCJWKSURL: c.JWKSURL, EnvOIDCRoleClaim: c.RoleClaim, EnvOIDCNameClaim: c.NameClaim} {
			if v != "" {
				errs = append(errs, fmt.Errorf("%s is set but %s is not: set the issuer to accept OIDC tokens", name, EnvOIDCIssuer))
			}
		}
		return OIDCConfig{}, errs
	}
	if err := checkIssuerURL(c.Issuer); err != nil {
		errs = append(errs, fmt.Errorf("%s: %w", EnvOIDCIssuer, err))
	}
	if c.Audience == "" {
		errs = append(errs, fmt.Errorf("%s is required with %s: the aud a token must carry (its client id or API identifier)", EnvOIDCAudience, EnvOIDCIssuer))
	}
	if c.JWKSURL != "" {
		if err := checkIssuerURL(c.JWKSURL); err != nil {
			errs = append(errs, fmt.Errorf("%s: %w", EnvOIDCJWKSURL, err))
		}
	}
	if c.RoleClaim == "" {
		c.RoleClaim = DefaultRoleClaim
	}
	if c.NameClaim == "" {
		c.NameClaim = DefaultNameClaim
	}
	return c, errs
}

// checkIssuerURL wants https, or http to a loopback host only: keys
// fetched over plain HTTP from elsewhere could be swapped on the way, and
// then anyone could sign tokens.
func checkIssuerURL(u string) error {
	scheme, rest, ok := strings.Cut(u, "://")
	host, _, _ := strings.Cut(rest, "/")
	switch {
	case !ok || host == "":
		return fmt.Errorf("%q is not an absolute URL", u)
	case scheme == "https":
		return nil
	case scheme == "http" && serve.IsLoopback(host):
		return nil
	}
	return fmt.Errorf("%q: want https (plain http only to a loopback host)", u)
}

// OIDCVerifier is the serve.Authenticator of JWTs from an OpenID Connect
// issuer: go-oidc's IDTokenVerifier checks the signature against the
// issuer's JWKS (jwks: cached, fetched again for a key it does not hold,
// which is how rotated keys are picked up, at a bounded rate), iss, aud
// and exp; the role and name come from the configured claims.
type OIDCVerifier struct {
	cfg    OIDCConfig
	log    zerolog.Logger
	now    func() time.Time
	client *http.Client

	mu       sync.Mutex
	verifier *oidc.IDTokenVerifier // nil until discovery succeeded
	keys     *jwks                 // the verifier's
	failedAt time.Time
	failErr  error
}

// NewOIDCVerifier returns a verifier for cfg. It does not reach the
// issuer: discovery happens on the first JWT (so a binary starts, and
// API tokens work, while the issuer is down), or never with a JWKS URL.
// now is the clock (time.Now when nil).
func NewOIDCVerifier(cfg OIDCConfig, log zerolog.Logger, now func() time.Time) (*OIDCVerifier, error) {
	if !cfg.Enabled() || cfg.Audience == "" {
		return nil, fmt.Errorf("new OIDC verifier: %s and %s are required", EnvOIDCIssuer, EnvOIDCAudience)
	}
	if cfg.RoleClaim == "" {
		cfg.RoleClaim = DefaultRoleClaim
	}
	if cfg.NameClaim == "" {
		cfg.NameClaim = DefaultNameClaim
	}
	if now == nil {
		now = time.Now
	}
	v := &OIDCVerifier{cfg: cfg, log: log, now: now, client: &http.Client{
		Timeout:   discoveryTimeout,
		Transport: capBody{http.DefaultTransport},
	}}
	if cfg.JWKSURL != "" {
		v.useKeys(cfg.JWKSURL)
	}
	return v, nil
}

// useKeys makes go-oidc's verifier over the JWKS at url.
func (v *OIDCVerifier) useKeys(url string) {
	v.keys = &jwks{url: url, client: v.client, now: v.now, log: v.log}
	v.verifier = oidc.NewVerifier(v.cfg.Issuer, v.keys, &oidc.Config{
		ClientID: v.cfg.Audience, SupportedSigningAlgs: signingAlgs, Now: v.now,
	})
}

// idTokenVerifier returns go-oidc's verifier, discovering the issuer first
// if need be. A failure is an outage (503), not the caller's fault, and is
// remembered for discoveryRetry so a down issuer is not asked by every
// request. The lock is held during discovery so one request asks and the
// others wait for its answer.
func (v *OIDCVerifier) idTokenVerifier(ctx context.Context) (*oidc.IDTokenVerifier, *jwks, error) {
	v.mu.Lock()
	defer v.mu.Unlock()
	if v.verifier != nil {
		return v.verifier, v.keys, nil
	}
	now := v.now()
	if v.failErr != nil && now.Sub(v.failedAt) < discoveryRetry {
		return nil, nil, v.failErr
	}
	if err := v.discover(ctx); err != nil {
		v.failedAt, v.failErr = now, fmt.Errorf("discover OIDC issuer %s: %w", v.cfg.Issuer, err)
		v.log.Warn().Err(err).Str("issuer", v.cfg.Issuer).Dur("retry_after", discoveryRetry).Msg("OIDC discovery failed; JWTs are refused with 503 until it succeeds")
		return nil, nil, v.failErr
	}
	v.failErr = nil
	v.log.Info().Str("issuer", v.cfg.Issuer).Str("jwks_url", v.keys.url).Msg("OIDC issuer discovered")
	return v.verifier, v.keys, nil
}

// discover reads the issuer's discovery document (go-oidc checks that its
// issuer is ours) for the JWKS URL, which must be https like the issuer.
func (v *OIDCVerifier) discover(ctx context.Context) error {
	// Not the request's own cancel: one client hanging up must not count
	// as the issuer failing.
	dctx, cancel := context.WithTimeout(oidc.ClientContext(context.WithoutCancel(ctx), v.client), discoveryTimeout)
	defer cancel()
	p, err := oidc.NewProvider(dctx, v.cfg.Issuer)
	if err != nil {
		return err
	}
	var meta struct {
		JWKSURI string `json:"jwks_uri"`
	}
	if err := p.Claims(&meta); err != nil {
		return err
	}
	if err := checkIssuerURL(meta.JWKSURI); err != nil {
		return fmt.Errorf("jwks_uri: %w", err)
	}
	v.useKeys(meta.JWKSURI)
	return nil
}

// Authenticate returns the principal of a JWT: an error wrapping
// serve.ErrBadCredential when it is too long, malformed, badly signed,
// expired or for another issuer or audience, or has no name; one wrapping
// serve.ErrNoRole when it is valid but names no retryd role; another
// error when the issuer could not be discovered.
func (v *OIDCVerifier) Authenticate(ctx context.Context, token string) (serve.Principal, error) {
	if len(token) > MaxBearerLen {
		return serve.Principal{}, fmt.Errorf("bearer token longer than %d bytes: %w", MaxBearerLen, serve.ErrBadCredential)
	}
	verifier, keys, err := v.idTokenVerifier(ctx)
	if err != nil {
		return serve.Principal{}, err
	}
	// No keys at all is an outage (503); go-oidc would report it as a bad
	// signature.
	if err := keys.ready(ctx); err != nil {
		return serve.Principal{}, err
	}
	idt, err := verifier.Verify(ctx, token)
	if err != nil {
		return serve.Principal{}, v.refusal(err)
	}
	var claims map[string]json.RawMessage
	if err := idt.Claims(&claims); err != nil {
		return serve.Principal{}, fmt.Errorf("read OIDC claims: %v: %w", err, serve.ErrBadCredential)
	}
	name, err := v.name(claims)
	if err != nil {
		return serve.Principal{}, err
	}
	role, ok := highestRole(claims[v.cfg.RoleClaim])
	if !ok {
		return serve.Principal{}, fmt.Errorf("%q is authenticated by OIDC but its claim %q names no retryd role (want producer, viewer, operator or admin): %w",
			name, v.cfg.RoleClaim, serve.ErrNoRole)
	}
	return serve.Principal{Name: name, Role: role}, nil
}

// refusal turns go-oidc's error into the 401's message. Signature errors
// may carry the JWKS response, so they are logged (at debug: a flood of
// bad tokens must not flood the log) and summed up for the client.
func (v *OIDCVerifier) refusal(err error) error {
	var expired *oidc.TokenExpiredError
	switch {
	case errors.As(err, &expired):
		return fmt.Errorf("OIDC token expired at %s: %w", expired.Expiry.UTC().Format(time.RFC3339), serve.ErrBadCredential)
	case strings.HasPrefix(err.Error(), "failed to verify signature"):
		v.log.Debug().Err(err).Msg("OIDC token refused")
		return fmt.Errorf("OIDC token signature not valid for the issuer's keys: %w", serve.ErrBadCredential)
	}
	return fmt.Errorf("OIDC token refused: %v: %w", err, serve.ErrBadCredential)
}

// name is the principal's name: OIDCPrefix and the name claim's string,
// printable and at most contract.MaxTokenLen bytes in all, since it is
// the `by` of lifecycle facts, which refuse longer.
func (v *OIDCVerifier) name(claims map[string]json.RawMessage) (string, error) {
	var s string
	if raw, ok := claims[v.cfg.NameClaim]; !ok || json.Unmarshal(raw, &s) != nil || s == "" {
		return "", fmt.Errorf("OIDC token has no string claim %q to name it: %w", v.cfg.NameClaim, serve.ErrBadCredential)
	}
	name := OIDCPrefix + s
	if len(name) > contract.MaxTokenLen || strings.IndexFunc(name, func(r rune) bool { return !unicode.IsPrint(r) }) >= 0 {
		return "", fmt.Errorf("OIDC claim %q must be printable and at most %d bytes: %w", v.cfg.NameClaim, contract.MaxTokenLen-len(OIDCPrefix), serve.ErrBadCredential)
	}
	return name, nil
}

// highestRole reads a role claim: a role's name, or an array of strings of
// which the highest role counts (producer < viewer < operator < admin;
// other strings, such as groups unrelated to retryd, are skipped).
func highestRole(raw json.RawMessage) (serve.Role, bool) {
	var names []string
	var one string
	if json.Unmarshal(raw, &one) == nil {
		names = []string{one}
	} else if json.Unmarshal(raw, &names) != nil {
		return 0, false
	}
	var best serve.Role
	found := false
	for _, n := range names {
		for _, r := range serve.Roles() {
			if n == r.String() && (!found || r > best) {
				best, found = r, true
			}
		}
	}
	return best, found
}

// capBody bounds what is read from the issuer: a discovery document or
// JWKS larger than maxDocument fails to decode instead of filling memory.
type capBody struct{ next http.RoundTripper }

func (c capBody) RoundTrip(r *http.Request) (*http.Response, error) {
	resp, err := c.next.RoundTrip(r)
	if err != nil {
		return nil, err
	}
	resp.Body = struct {
		io.Reader
		io.Closer
	}{io.LimitReader(resp.Body, maxDocument), resp.Body}
	return resp, nil
}
