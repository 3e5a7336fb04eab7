package ingress

import (
	"context"
	"slices"
	"sync"
	"time"

	"github.com/retryd/retryd/services/ingress/internal/ingressstore"
)

// maxCachedSources bounds the intake cache; it is emptied when full.
const maxCachedSources = 10_000

// typeCache is intake's copy of each source's allowed types, so that
// accepting an event does not cost a database read. The gate checks the
// database in its transaction; this cache only lets intake answer 400 early.
type typeCache struct {
	db  ingressstore.DB
	ttl time.Duration
	now func() time.Time

	mu      sync.Mutex
	entries map[string]typeEntry
}

type typeEntry struct {
	allowed []string // empty: any type
	expires time.Time
}

func newTypeCache(db ingressstore.DB, ttl time.Duration, now func() time.Time) *typeCache {
	return &typeCache{db: db, ttl: ttl, now: now, entries: map[string]typeEntry{}}
}

// lookupTimeout bounds the database read of a cache miss, so intake stays
// fast while Postgres is slow or away.
const lookupTimeout = time.Second

// allows reports whether source may send typ. When the database cannot be
// read, the error is returned (once per TTL and source) with allowed true,
// and any type is allowed until the TTL ends: intake stays open while
// Postgres is away and the gate decides later.
func (c *typeCache) allows(ctx context.Context, source, typ string) (bool, error) {
	now := c.now()
	c.mu.Lock()
	e, ok := c.entries[source]
	c.mu.Unlock()
	var err error
	if !ok || now.After(e.expires) {
		lctx, cancel := context.WithTimeout(ctx, lookupTimeout)
		var types []string
		types, err = ingressstore.AllowedTypes(lctx, c.db, source)
		cancel()
		if err != nil && ctx.Err() != nil {
			// The request ended; do not cache its failure.
			return true, nil
		}
		e = typeEntry{allowed: types, expires: now.Add(c.ttl)}
		c.mu.Lock()
		if len(c.entries) >= maxCachedSources {
			clear(c.entries)
		}
		c.entries[source] = e
		c.mu.Unlock()
	}
	return len(e.allowed) == 0 || slices.Contains(e.allowed, typ), err
}

// forget drops a source after this instance changed it.
func (c *typeCache) forget(source string) {
	c.mu.Lock()
	delete(c.entries, source)
	c.mu.Unlock()
}
