package main

import (
	"bytes"
	"encoding/json"
	"fmt"
	"maps"
	"slices"
	"strings"

	"github.com/retryd/retryd/pkg/policy"
)

// parseClassBackoff reads --class-backoff: a JSON object of error class to
// backoff, as the API takes it, e.g.
// {"rate_limit":{"base_delay_ms":60000},"timeout":{"first_delay_ms":0}}.
func parseClassBackoff(v string) (map[string]policy.ClassBackoffMS, error) {
	dec := json.NewDecoder(strings.NewReader(v))
	dec.DisallowUnknownFields()
	out := map[string]policy.ClassBackoffMS{}
	if err := dec.Decode(&out); err != nil {
		return nil, fmt.Errorf("%q is not a JSON object of class to backoff (base_delay_ms, max_delay_ms, multiplier, jitter, jitter_ms, first_delay_ms): %w", v, err)
	}
	if dec.More() {
		return nil, fmt.Errorf("%q has data after the JSON object", v)
	}
	return out, nil
}

// describeClassBackoff is one line per class for `policies get`, in class
// order: "rate_limit: 1m x2 capped at 1h".
func describeClassBackoff(p policy.Policy) string {
	if len(p.ClassBackoff) == 0 {
		return "(none: every class uses the backoff above)"
	}
	var b bytes.Buffer
	for i, c := range slices.Sorted(maps.Keys(p.ClassBackoff)) {
		cfg, cb := p.BackoffFor(c)
		if i > 0 {
			b.WriteString("; ")
		}
		fmt.Fprintf(&b, "%s: ", c)
		if cb.FirstDelay != nil {
			fmt.Fprintf(&b, "first retry after %s, then ", duration(*cb.FirstDelay))
		}
		fmt.Fprintf(&b, "%s x%g capped at %s", duration(cfg.Base), cfg.Multiplier, duration(cfg.Max))
	}
	return b.String()
}
