package policy

import (
	"time"

	"github.com/retryd/retryd/pkg/backoff"
	"github.com/retryd/retryd/pkg/errclass"
)

// ClassBackoffMS is a ClassBackoff as the API, the CLI and the database
// hold it: durations in milliseconds, nil fields keeping the policy's.
type ClassBackoffMS struct {
	BaseDelayMS  *int64   `json:"base_delay_ms,omitempty"`
	MaxDelayMS   *int64   `json:"max_delay_ms,omitempty"`
	Multiplier   *float64 `json:"multiplier,omitempty"`
	Jitter       *string  `json:"jitter,omitempty"`
	JitterMS     *int64   `json:"jitter_ms,omitempty"`
	FirstDelayMS *int64   `json:"first_delay_ms,omitempty"`
}

// ClassBackoffsFromMS converts per-class backoffs keyed by class name for
// Decide; nil when there are none. Validate checks the result.
func ClassBackoffsFromMS(in map[string]ClassBackoffMS) map[errclass.Class]ClassBackoff {
	if len(in) == 0 {
		return nil
	}
	ms := func(v *int64) *time.Duration {
		if v == nil {
			return nil
		}
		d := FromMS(*v)
		return &d
	}
	out := make(map[errclass.Class]ClassBackoff, len(in))
	for c, cb := range in {
		pc := ClassBackoff{Base: ms(cb.BaseDelayMS), Max: ms(cb.MaxDelayMS), Multiplier: cb.Multiplier,
			JitterMax: ms(cb.JitterMS), FirstDelay: ms(cb.FirstDelayMS)}
		if cb.Jitter != nil {
			j := backoff.Jitter(*cb.Jitter)
			pc.Jitter = &j
		}
		out[errclass.Class(c)] = pc
	}
	return out
}

// ClassBackoffsToMS is the inverse of ClassBackoffsFromMS, for the API and
// the database; an empty map, never nil, when there are none, as
// retry_policies.class_backoff holds '{}'.
func ClassBackoffsToMS(in map[errclass.Class]ClassBackoff) map[string]ClassBackoffMS {
	ms := func(d *time.Duration) *int64 {
		if d == nil {
			return nil
		}
		v := d.Milliseconds()
		return &v
	}
	out := make(map[string]ClassBackoffMS, len(in))
	for c, cb := range in {
		w := ClassBackoffMS{BaseDelayMS: ms(cb.Base), MaxDelayMS: ms(cb.Max), Multiplier: cb.Multiplier,
			JitterMS: ms(cb.JitterMax), FirstDelayMS: ms(cb.FirstDelay)}
		if cb.Jitter != nil {
			j := string(*cb.Jitter)
			w.Jitter = &j
		}
		out[string(c)] = w
	}
	return out
}
