package auth

import (
	"context"
	"crypto/ecdsa"
	"crypto/ed25519"
	"crypto/rsa"
	"encoding/json"
	"errors"
	"fmt"
	"net/http"
	"sync"
	"time"

	"github.com/coreos/go-oidc/v3/oidc"
	"github.com/go-jose/go-jose/v4"
	"github.com/rs/zerolog"
)

// Bounds of the JWKS cache.
const (
	// jwksMinRefresh is how often the JWKS is fetched at most: a token
	// naming a key that is not held fetches it again, but a flood of
	// forged tokens costs the issuer one request per this, not one per
	// token. A key the issuer starts using within this of the last fetch
	// is refused until it passes.
	jwksMinRefresh = 10 * time.Second
	// jwksMaxAge is how long keys are trusted without asking: a key the
	// issuer removed (rotated out, or compromised) stops verifying within
	// this.
	jwksMaxAge = time.Hour
	// maxKeys bounds the keys a token is tried against.
	maxKeys = 32
)

// signingAlgs are the algorithms a token may be signed with: go-oidc's
// asymmetric ones. Never HS256 (the public key would be the secret) or
// none.
var signingAlgs = []string{
	oidc.RS256, oidc.RS384, oidc.RS512, oidc.ES256, oidc.ES384, oidc.ES512,
	oidc.PS256, oidc.PS384, oidc.PS512, oidc.EdDSA,
}

var errBadSignature = errors.New("no key of the issuer verifies the signature")

// jwks is the oidc.KeySet of an issuer's JWKS. go-oidc's own
// RemoteKeySet fetches the JWKS again on every signature that does not
// verify, so each forged token would make a request to the issuer; this
// one fetches when it holds no keys, when they are older than
// jwksMaxAge, or when a token names a key it does not hold, and never
// more often than jwksMinRefresh. A token naming a held key that does
// not verify is forged: it fetches nothing.
type jwks struct {
	url    string
	client *http.Client
	now    func() time.Time
	log    zerolog.Logger

	// mu is held during a fetch, so one request fetches and the others
	// wait for its keys.
	mu      sync.Mutex
	keys    []jose.JSONWebKey
	fetched time.Time // of the keys; zero: none yet
	tried   time.Time // the last fetch, whatever its outcome
	lastErr error
}

// VerifySignature returns the payload of a JWT signed by one of the
// issuer's keys. IDTokenVerifier calls it after checking the algorithm.
func (k *jwks) VerifySignature(ctx context.Context, token string) ([]byte, error) {
	jws, err := jose.ParseSigned(token, algs())
	if err != nil {
		return nil, fmt.Errorf("parse JWT: %w", err)
	}
	if len(jws.Signatures) != 1 {
		return nil, errors.New("parse JWT: want exactly one signature")
	}
	kid := jws.Signatures[0].Header.KeyID
	keys, err := k.get(ctx, false)
	if err != nil {
		return nil, err
	}
	switch p, held := verifyWith(jws, kid, keys); {
	case p != nil:
		return p, nil
	case held:
		return nil, errBadSignature
	}
	// A key not held: perhaps one the issuer just added.
	if keys, err = k.get(ctx, true); err != nil {
		return nil, err
	}
	if p, _ := verifyWith(jws, kid, keys); p != nil {
		return p, nil
	}
	return nil, errBadSignature
}

// verifyWith returns the payload if a key verifies it, and whether the
// token names a key that is held (then fetching again would not help).
func verifyWith(jws *jose.JSONWebSignature, kid string, keys []jose.JSONWebKey) (payload []byte, held bool) {
	for _, key := range keys {
		if kid != "" && key.KeyID != kid {
			continue
		}
		held = held || kid != ""
		if p, err := jws.Verify(key.Key); err == nil {
			return p, true
		}
	}
	return nil, held
}

// ready fetches the keys if none are held yet: an error is an outage
// (503), not a bad token.
func (k *jwks) ready(ctx context.Context) error {
	_, err := k.get(ctx, false)
	return err
}

// get returns the held keys, fetched again first when due (or when force)
// and jwksMinRefresh has passed since the last fetch. A failed fetch keeps
// the old keys; with none it is an error.
func (k *jwks) get(ctx context.Context, force bool) ([]jose.JSONWebKey, error) {
	k.mu.Lock()
	defer k.mu.Unlock()
	now := k.now()
	due := force || k.fetched.IsZero() || now.Sub(k.fetched) >= jwksMaxAge
	if due && (k.tried.IsZero() || now.Sub(k.tried) >= jwksMinRefresh) {
		k.tried = now
		keys, err := k.fetch(ctx)
		if err != nil {
			k.lastErr = err
			k.log.Warn().Err(err).Str("jwks_url", k.url).Msg("could not fetch the OIDC issuer's keys")
		} else {
			k.keys, k.fetched, k.lastErr = keys, now, nil
		}
	}
	if k.fetched.IsZero() {
		if k.lastErr == nil {
			return nil, errors.New("fetch JWKS: not yet")
		}
		return nil, k.lastErr
	}
	return k.keys, nil
}

// fetch reads the JWKS: its public signing keys (RSA, ECDSA, Ed25519),
// skipping any other (encryption keys, symmetric keys, types go-jose does
// not know), as RFC 7517 asks.
func (k *jwks) fetch(ctx context.Context) ([]jose.JSONWebKey, error) {
	// Not the request's own cancel: a client hanging up must not count as
	// the issuer failing. The client's timeout bounds it.
	req, err := http.NewRequestWithContext(context.WithoutCancel(ctx), http.MethodGet, k.url, nil)
	if err != nil {
		return nil, fmt.Errorf("fetch JWKS: %w", err)
	}
	resp, err := k.client.Do(req)
	if err != nil {
		return nil, fmt.Errorf("fetch JWKS: %w", err)
	}
	defer resp.Body.Close()
	if resp.StatusCode != http.StatusOK {
		return nil, fmt.Errorf("fetch JWKS %s: %s", k.url, resp.Status)
	}
	var set struct {
		Keys []json.RawMessage `json:"keys"`
	}
	if err := json.NewDecoder(resp.Body).Decode(&set); err != nil {
		return nil, fmt.Errorf("decode JWKS %s: %w", k.url, err)
	}
	var keys []jose.JSONWebKey
	for _, raw := range set.Keys {
		var key jose.JSONWebKey
		if json.Unmarshal(raw, &key) != nil || (key.Use != "" && key.Use != "sig") {
			continue
		}
		key = key.Public()
		switch key.Key.(type) {
		case *rsa.PublicKey, *ecdsa.PublicKey, ed25519.PublicKey:
			keys = append(keys, key)
		}
		if len(keys) == maxKeys {
			break
		}
	}
	if len(keys) == 0 {
		return nil, fmt.Errorf("decode JWKS %s: no public signing key", k.url)
	}
	return keys, nil
}

func algs() []jose.SignatureAlgorithm {
	out := make([]jose.SignatureAlgorithm, len(signingAlgs))
	for i, a := range signingAlgs {
		out[i] = jose.SignatureAlgorithm(a)
	}
	return out
}
