package contract

import (
	"bytes"
	"encoding/json"
	"fmt"
	"math"
	"regexp"
	"strconv"
	"time"
)

// MaxRetryAfter bounds a retry-after hint; the scheduler caps it further at
// the policy's max delay.
const MaxRetryAfter = 366 * 24 * time.Hour

var decimalPattern = regexp.MustCompile(`^[0-9]+(\.[0-9]+)?$`)

// RetryAfter is the owner's hint for when to try again, as in HTTP's
// Retry-After: either an absolute time (RFC 3339 string) or a number of
// seconds (JSON number, or a string of digits).
type RetryAfter struct {
	At    time.Time
	After time.Duration
}

// RetryAfterAt builds an absolute hint.
func RetryAfterAt(t time.Time) *RetryAfter { return &RetryAfter{At: t.UTC()} }

// RetryAfterDuration builds a relative hint.
func RetryAfterDuration(d time.Duration) *RetryAfter { return &RetryAfter{After: d} }

// Delay resolves the hint against the failure time; never negative.
func (r RetryAfter) Delay(failedAt time.Time) time.Duration {
	d := r.After
	if !r.At.IsZero() {
		d = r.At.Sub(failedAt)
	}
	return max(d, 0)
}

// MarshalJSON writes an RFC 3339 string for absolute hints and seconds for
// relative ones.
func (r RetryAfter) MarshalJSON() ([]byte, error) {
	if !r.At.IsZero() {
		return json.Marshal(r.At.UTC().Format(time.RFC3339Nano))
	}
	return []byte(strconv.FormatFloat(r.After.Seconds(), 'f', -1, 64)), nil
}

// UnmarshalJSON accepts a number of seconds, a string of seconds or an
// RFC 3339 time.
func (r *RetryAfter) UnmarshalJSON(b []byte) error {
	b = bytes.TrimSpace(b)
	if len(b) > 0 && b[0] == '"' {
		var s string
		if err := json.Unmarshal(b, &s); err != nil {
			return err
		}
		// Only plain decimals count as seconds: ParseFloat alone would also
		// take "Inf", "NaN" and hex floats such as "0x1p-2".
		if decimalPattern.MatchString(s) {
			secs, err := strconv.ParseFloat(s, 64)
			if err != nil {
				return fmt.Errorf("retry_after %q is not a number of seconds", s)
			}
			return r.setSeconds(secs)
		}
		t, err := time.Parse(time.RFC3339Nano, s)
		if err != nil {
			return fmt.Errorf("retry_after %q is neither RFC 3339 nor a number of seconds", s)
		}
		if !inYearRange(t) {
			return fmt.Errorf("retry_after %q is not between the years 0001 and 9999 in UTC", s)
		}
		*r = RetryAfter{At: t.UTC()}
		return nil
	}
	secs, err := strconv.ParseFloat(string(b), 64)
	if err != nil {
		return fmt.Errorf("retry_after must be an RFC 3339 string or a number of seconds")
	}
	return r.setSeconds(secs)
}

func (r *RetryAfter) setSeconds(secs float64) error {
	if math.IsNaN(secs) || secs < 0 || secs > MaxRetryAfter.Seconds() {
		return fmt.Errorf("retry_after must be between 0 and %d seconds", int64(MaxRetryAfter.Seconds()))
	}
	// Rounded, not truncated: 0.3 * 1e9 is 299999999.99999994 in float64,
	// and a hint must survive MarshalJSON/UnmarshalJSON unchanged.
	*r = RetryAfter{After: time.Duration(math.Round(secs * float64(time.Second)))}
	return nil
}

// inYearRange reports whether t, in UTC, can be written as RFC 3339 again:
// "9999-12-31T23:00:00-05:00" is year 10000 in UTC, which encoding/json
// refuses to marshal.
func inYearRange(t time.Time) bool {
	y := t.UTC().Year()
	return y >= 1 && y <= 9999
}
