package auth

import (
	"context"
	"crypto/sha256"
	"errors"
	"fmt"
	"sync"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/rs/zerolog"

	"github.com/retryd/retryd/internal/serve"
)

// Defaults of VerifierConfig.
const (
	// DefaultCacheTTL is how long a token's record is trusted before it is
	// read again: a revoked token stops working within this long on every
	// service, and a busy API reads each token at most this often.
	DefaultCacheTTL = 5 * time.Second
	// DefaultTouchEvery is how often last_used_at is written per token at
	// most, so a token used a thousand times a second costs one UPDATE a
	// minute.
	DefaultTouchEvery = time.Minute
	// maxCached bounds the cache: a flood of made-up tokens cannot grow it
	// without end (well-formed unknown tokens are cached too, so they cost
	// one query per TTL each).
	maxCached = 10_000
)

// VerifierConfig configures a Verifier.
type VerifierConfig struct {
	Store *Store
	// CacheTTL: DefaultCacheTTL when zero.
	CacheTTL time.Duration
	// TouchEvery: DefaultTouchEvery when zero.
	TouchEvery time.Duration
	Logger     zerolog.Logger
	// Now is the clock; time.Now when nil (tests move it).
	Now func() time.Time
}

func (c *VerifierConfig) validate() error {
	if c.Store == nil {
		return errors.New("auth verifier: Store is required")
	}
	if c.CacheTTL < 0 {
		return fmt.Errorf("auth verifier: CacheTTL %s is negative", c.CacheTTL)
	}
	if c.TouchEvery < 0 {
		return fmt.Errorf("auth verifier: TouchEvery %s is negative", c.TouchEvery)
	}
	if c.CacheTTL == 0 {
		c.CacheTTL = DefaultCacheTTL
	}
	if c.TouchEvery == 0 {
		c.TouchEvery = DefaultTouchEvery
	}
	if c.Now == nil {
		c.Now = time.Now
	}
	return nil
}

// Verifier is the serve.Authenticator of API tokens.
type Verifier struct {
	cfg   VerifierConfig
	mu    sync.Mutex
	cache map[[sha256.Size]byte]*entry
}

type entry struct {
	tok     Token
	found   bool
	loaded  time.Time // when tok was read
	touched time.Time // when this process last wrote last_used_at
}

// NewVerifier returns a verifier of the store's tokens.
func NewVerifier(cfg VerifierConfig) (*Verifier, error) {
	if err := cfg.validate(); err != nil {
		return nil, err
	}
	return &Verifier{cfg: cfg, cache: map[[sha256.Size]byte]*entry{}}, nil
}

// Authenticate returns the principal of token: an error wrapping
// serve.ErrBadCredential when it is malformed, unknown, revoked or
// expired, another error when Postgres could not be asked.
func (v *Verifier) Authenticate(ctx context.Context, token string) (serve.Principal, error) {
	if !wellFormed(token) {
		return serve.Principal{}, fmt.Errorf("malformed token: %w", serve.ErrBadCredential)
	}
	key := sha256.Sum256([]byte(token))
	now := v.cfg.Now()
	e, err := v.entry(ctx, key, now)
	if err != nil {
		return serve.Principal{}, err
	}
	t := e.tok
	switch {
	case !e.found:
		return serve.Principal{}, fmt.Errorf("unknown token: %w", serve.ErrBadCredential)
	case t.RevokedAt != nil:
		return serve.Principal{}, fmt.Errorf("token %q is revoked: %w", t.Name, serve.ErrBadCredential)
	case t.ExpiresAt != nil && !now.Before(*t.ExpiresAt):
		return serve.Principal{}, fmt.Errorf("token %q expired at %s: %w", t.Name, t.ExpiresAt.UTC().Format(time.RFC3339), serve.ErrBadCredential)
	}
	v.touch(ctx, key, e, now)
	return serve.Principal{Name: t.Name, Role: t.Role}, nil
}

// entry returns the cached record of key, reading it again once CacheTTL
// passed.
func (v *Verifier) entry(ctx context.Context, key [sha256.Size]byte, now time.Time) (entry, error) {
	v.mu.Lock()
	e, ok := v.cache[key]
	if ok && now.Sub(e.loaded) < v.cfg.CacheTTL {
		out := *e
		v.mu.Unlock()
		return out, nil
	}
	v.mu.Unlock()

	// Read outside the lock: one slow query must not hold every request.
	t, err := v.cfg.Store.lookup(ctx, key[:])
	found := err == nil
	if err != nil && !errors.Is(err, pgx.ErrNoRows) {
		return entry{}, err
	}
	v.mu.Lock()
	defer v.mu.Unlock()
	if len(v.cache) >= maxCached {
		clear(v.cache)
	}
	ne := &entry{tok: t, found: found, loaded: now}
	if old, ok := v.cache[key]; ok {
		ne.touched = old.touched
	}
	v.cache[key] = ne
	return *ne, nil
}

// touch writes last_used_at when this process has not for TouchEvery
// (and the stored value is older than that too). A failed write is
// logged, not fatal: the request is authentic either way.
func (v *Verifier) touch(ctx context.Context, key [sha256.Size]byte, e entry, now time.Time) {
	last := e.touched
	if e.tok.LastUsedAt != nil && e.tok.LastUsedAt.After(last) {
		last = *e.tok.LastUsedAt
	}
	if now.Sub(last) < v.cfg.TouchEvery {
		return
	}
	v.mu.Lock()
	if c, ok := v.cache[key]; ok {
		if now.Sub(c.touched) < v.cfg.TouchEvery {
			v.mu.Unlock()
			return // another request just did
		}
		c.touched = now
	}
	v.mu.Unlock()
	if err := v.cfg.Store.touch(ctx, e.tok.ID, now); err != nil {
		v.cfg.Logger.Warn().Err(err).Str("token_id", e.tok.ID).Msg("could not record the token's last use")
	}
}
