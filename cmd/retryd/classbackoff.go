package main

import (
	"bytes"
	"encoding/json"
	"fmt"
	"slices"
	"strings"
)

// parseClassBackoff reads --class-backoff: a JSON object of error class to
// backoff, as the API takes it, e.g.
// {"rate_limit":{"base_delay_ms":60000},"timeout":{"first_delay_ms":0}}.
func parseClassBackoff(v string) (map[string]classBackoffView, error) {
	dec := json.NewDecoder(strings.NewReader(v))
	dec.DisallowUnknownFields()
	out := map[string]classBackoffView{}
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
func describeClassBackoff(p policyView) string {
	if len(p.ClassBackoff) == 0 {
		return "(none: every class uses the backoff above)"
	}
	classes := make([]string, 0, len(p.ClassBackoff))
	for c := range p.ClassBackoff {
		classes = append(classes, c)
	}
	slices.Sort(classes)
	var b bytes.Buffer
	for i, c := range classes {
		cb := p.ClassBackoff[c]
		base, maxDelay, mult := p.BaseDelayMS, p.MaxDelayMS, p.Multiplier
		if cb.BaseDelayMS != nil {
			base = *cb.BaseDelayMS
		}
		if cb.MaxDelayMS != nil {
			maxDelay = *cb.MaxDelayMS
		}
		if cb.Multiplier != nil {
			mult = *cb.Multiplier
		}
		if i > 0 {
			b.WriteString("; ")
		}
		fmt.Fprintf(&b, "%s: ", c)
		if cb.FirstDelayMS != nil {
			fmt.Fprintf(&b, "first retry after %s, then ", msDuration(*cb.FirstDelayMS))
		}
		fmt.Fprintf(&b, "%s x%g capped at %s", msDuration(base), mult, msDuration(maxDelay))
	}
	return b.String()
}
