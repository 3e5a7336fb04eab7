package contract_test

import (
	"encoding/json"
	"testing"
	"time"

	"github.com/stretchr/testify/require"

	"github.com/retryd/retryd/pkg/contract"
)

func TestRetryAfterJSON(t *testing.T) {
	t.Parallel()
	at := time.Date(2025, 3, 14, 16, 0, 0, 0, time.UTC)
	good := []struct {
		in   string
		want contract.RetryAfter
		out  string
	}{
		{`30`, contract.RetryAfter{After: 30 * time.Second}, `30`},
		{`0`, contract.RetryAfter{}, `0`},
		{`1.5`, contract.RetryAfter{After: 1500 * time.Millisecond}, `1.5`},
		{`0.3`, contract.RetryAfter{After: 300 * time.Millisecond}, `0.3`},
		{`1e2`, contract.RetryAfter{After: 100 * time.Second}, `100`},
		{`"120"`, contract.RetryAfter{After: 2 * time.Minute}, `120`},
		{`"0.25"`, contract.RetryAfter{After: 250 * time.Millisecond}, `0.25`},
		{`"2025-03-14T16:00:00Z"`, contract.RetryAfter{At: at}, `"2025-03-14T16:00:00Z"`},
		{`"2025-03-14T17:00:00+01:00"`, contract.RetryAfter{At: at}, `"2025-03-14T16:00:00Z"`},
		{`"31622400"`, contract.RetryAfter{After: contract.MaxRetryAfter}, `31622400`},
	}
	for _, tc := range good {
		var r contract.RetryAfter
		require.NoError(t, json.Unmarshal([]byte(tc.in), &r), tc.in)
		require.Equal(t, tc.want, r, tc.in)
		out, err := json.Marshal(r)
		require.NoError(t, err)
		require.Equal(t, tc.out, string(out), tc.in)
	}
	bad := []string{
		`-1`, `"-1"`, `31622401`, `1e400`, `"1e3"`, `"Inf"`, `"NaN"`, `"+5"`, `"0x1p-2"`, `" 5"`,
		`"tomorrow"`, `"2025-03-14"`, `true`, `{}`, `[]`, `"1_000"`,
	}
	for _, in := range bad {
		var r contract.RetryAfter
		err := json.Unmarshal([]byte(in), &r)
		require.Error(t, err, in)
	}
}

func TestRetryAfterDelay(t *testing.T) {
	t.Parallel()
	require.Equal(t, 30*time.Second, contract.RetryAfterDuration(30*time.Second).Delay(now))
	require.Equal(t, time.Minute, contract.RetryAfterAt(now.Add(time.Minute)).Delay(now))
	require.Equal(t, time.Duration(0), contract.RetryAfterAt(now.Add(-time.Minute)).Delay(now), "never negative")
	require.Equal(t, time.UTC, contract.RetryAfterAt(now.In(time.FixedZone("x", 3600))).At.Location())
}

// Every duration a hint can hold survives a JSON round trip exactly.
func TestRetryAfterRoundTripDurations(t *testing.T) {
	t.Parallel()
	for _, d := range []time.Duration{1, 7, 15, 63, 300 * time.Millisecond, 1234567891, 299999999, 86400*time.Second + 1, time.Duration(1<<53 - 1)} {
		b, err := json.Marshal(contract.RetryAfterDuration(d))
		require.NoError(t, err)
		var r contract.RetryAfter
		require.NoError(t, json.Unmarshal(b, &r))
		require.Equal(t, d, r.After, "%s as %s", d, b)
	}
}
