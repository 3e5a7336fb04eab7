package triggers

import (
	"container/list"
	"sync"

	"cel.dev/cel-go/cel"
)

// compiled holds the programs of one trigger version; nil programs mean
// "no predicate" and "one throttle budget for the trigger".
type compiled struct {
	predicate cel.Program
	key       cel.Program
}

type programKey struct {
	triggerID string
	version   int
}

// programCache keeps the compiled programs of the most recently used
// trigger versions. Versions never change once written, so entries are
// never stale; old versions simply fall out. Compiled programs are safe
// for concurrent use.
type programCache struct {
	mu    sync.Mutex
	max   int
	order *list.List // front = most recently used; values are *cacheEntry
	items map[programKey]*list.Element
}

type cacheEntry struct {
	key   programKey
	progs compiled
}

func newProgramCache(max int) *programCache {
	return &programCache{max: max, order: list.New(), items: make(map[programKey]*list.Element, max)}
}

func (c *programCache) get(k programKey) (compiled, bool) {
	c.mu.Lock()
	defer c.mu.Unlock()
	el, ok := c.items[k]
	if !ok {
		return compiled{}, false
	}
	c.order.MoveToFront(el)
	return el.Value.(*cacheEntry).progs, true
}

func (c *programCache) put(k programKey, p compiled) {
	c.mu.Lock()
	defer c.mu.Unlock()
	if el, ok := c.items[k]; ok {
		c.order.MoveToFront(el)
		return
	}
	c.items[k] = c.order.PushFront(&cacheEntry{key: k, progs: p})
	for c.order.Len() > c.max {
		oldest := c.order.Back()
		c.order.Remove(oldest)
		delete(c.items, oldest.Value.(*cacheEntry).key)
	}
}

func (c *programCache) len() int {
	c.mu.Lock()
	defer c.mu.Unlock()
	return c.order.Len()
}
