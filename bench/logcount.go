package main

import (
	"fmt"
	"io"
	"slices"
	"strings"
	"sync"

	"github.com/rs/zerolog"
)

// logCount counts what the in-process scheduler logs at warn and above,
// so a run can say how many errors it logged (the scheduler's log is
// otherwise discarded: ids only, nothing a figure needs).
type logCount struct {
	mu       sync.Mutex
	n        int
	messages map[string]int
}

func (c *logCount) Run(_ *zerolog.Event, level zerolog.Level, msg string) {
	if level < zerolog.WarnLevel {
		return
	}
	c.mu.Lock()
	defer c.mu.Unlock()
	c.n++
	if c.messages == nil {
		c.messages = map[string]int{}
	}
	c.messages[msg]++
}

func (c *logCount) logger() zerolog.Logger {
	return zerolog.New(io.Discard).Level(zerolog.WarnLevel).Hook(c)
}

// String reports the count and the most frequent messages.
func (c *logCount) String() string {
	c.mu.Lock()
	defer c.mu.Unlock()
	if c.n == 0 {
		return "0 warnings or errors logged"
	}
	keys := make([]string, 0, len(c.messages))
	for k := range c.messages {
		keys = append(keys, k)
	}
	slices.SortFunc(keys, func(a, b string) int { return c.messages[b] - c.messages[a] })
	var parts []string
	for _, k := range keys[:min(len(keys), 3)] {
		parts = append(parts, fmt.Sprintf("%q x%d", k, c.messages[k]))
	}
	return fmt.Sprintf("%d warnings or errors logged: %s", c.n, strings.Join(parts, ", "))
}
