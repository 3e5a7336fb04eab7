package policy_test

import (
	"encoding/json"
	"math"
	"testing"
	"time"

	"github.com/stretchr/testify/require"

	"github.com/retryd/retryd/pkg/backoff"
	"github.com/retryd/retryd/pkg/contract"
	"github.com/retryd/retryd/pkg/errclass"
	"github.com/retryd/retryd/pkg/policy"
)

// The JSON form is the policy API's contract (docs/scheduler.md): these
// bytes are what GET /v1/policies/job/email_campaign has always answered,
// and decoding them gives the policy back.
func TestJSONForm(t *testing.T) {
	t.Parallel()
	first := time.Duration(0)
	at := time.Date(2026, 11, 22, 0, 26, 29, 279000000, time.UTC)
	p := policy.Policy{
		Kind: contract.KindJob, JobType: "email_campaign", Name: "email-campaign", Version: 3, MaxRetries: 4,
		Backoff: backoff.Config{Base: 30 * time.Minute, Multiplier: 2, Max: 6 * time.Hour,
			Jitter: backoff.JitterAdditive, JitterMax: 5 * time.Minute},
		NonRetryableClasses: []errclass.Class{errclass.Authentication, errclass.Permission, errclass.Validation},
		Enabled:             true, MaxHold: policy.DefaultMaxHold, MaxRetryAfter: policy.DefaultMaxRetryAfter,
		ClassBackoff: map[errclass.Class]policy.ClassBackoff{errclass.Timeout: {FirstDelay: &first}},
		UpdatedBy:    "alice", CreatedAt: at, UpdatedAt: at.Add(time.Hour),
	}
	const want = `{"kind":"job","job_type":"email_campaign","name":"email-campaign","version":3,` +
		`"max_retries":4,"base_delay_ms":1800000,"multiplier":2,"max_delay_ms":21600000,"jitter":"additive",` +
		`"jitter_ms":300000,"retryable_classes":[],"non_retryable_classes":["authentication","permission","validation"],` +
		`"enabled":true,"max_hold_ms":2592000000,"max_retry_after_ms":86400000,` +
		`"class_backoff":{"timeout":{"first_delay_ms":0}},"updated_by":"alice",` +
		`"created_at":"2026-11-22T00:26:29.279Z","updated_at":"2026-11-22T01:26:29.279Z"}`
	raw, err := json.Marshal(p)
	require.NoError(t, err)
	require.JSONEq(t, want, string(raw))
	require.Equal(t, want, string(raw), "the field order of the API too")

	var back policy.Policy
	require.NoError(t, json.Unmarshal(raw, &back))
	require.Equal(t, p, back)

	// Nothing set is still every field, lists and objects empty, not null.
	raw, err = json.Marshal(policy.Policy{})
	require.NoError(t, err)
	require.Contains(t, string(raw), `"retryable_classes":[],"non_retryable_classes":[]`)
	require.Contains(t, string(raw), `"class_backoff":{}`)
}

// Decoding reads over what is there, so fields left out keep a preset
// value, and ignores fields it does not know (a newer server's).
func TestUnmarshalKeepsFieldsLeftOut(t *testing.T) {
	t.Parallel()
	p := policy.New("job", "sync")
	require.NoError(t, json.Unmarshal([]byte(`{"name":"sync","max_retries":2,"base_delay_ms":1500,"future":true}`), &p))
	want := policy.New("job", "sync")
	want.Name, want.MaxRetries, want.Backoff.Base = "sync", 2, 1500*time.Millisecond
	require.Equal(t, want, p)
}

func TestDecodeBody(t *testing.T) {
	t.Parallel()
	p := policy.New("", "")
	set, err := policy.DecodeBody([]byte(`{"name":"x","max_retries":1,"max_delay_ms":null,"enabled":false}`), &p)
	require.NoError(t, err)
	require.Equal(t, []string{"enabled", "max_retries", "name"}, set, "null counts as left out")
	require.False(t, p.Enabled)
	require.Equal(t, 2.0, p.Backoff.Multiplier, "left out: kept")

	_, err = policy.DecodeBody([]byte(`{"name":"x","max_retry":1}`), &p)
	require.ErrorContains(t, err, `unknown field "max_retry"`)

	_, err = policy.DecodeBody([]byte(`{"name":"a\u0000b"}`), &p)
	requireField(t, err, "name")

	_, err = policy.DecodeBody([]byte(`{"class_backoff":{"timeout":{"jitter":"a\u0000"}}}`), &p)
	requireField(t, err, "class_backoff.timeout.jitter")
}

// A figure of milliseconds too large for a Duration saturates, so that
// Validate refuses it instead of seeing it wrapped around.
func TestFromMSSaturates(t *testing.T) {
	t.Parallel()
	require.Equal(t, 1500*time.Millisecond, policy.FromMS(1500))
	require.Equal(t, time.Duration(math.MaxInt64), policy.FromMS(math.MaxInt64))
	require.Equal(t, time.Duration(math.MinInt64), policy.FromMS(math.MinInt64))

	var p policy.Policy
	require.NoError(t, json.Unmarshal([]byte(`{"name":"x","version":1,"kind":"job","multiplier":2,"jitter":"none","base_delay_ms":0,"max_delay_ms":18446744073709}`), &p))
	requireField(t, p.Validate(), "max_delay_ms")
}

// The seeded policies are valid, and the fallback is the "*" one.
func TestDefaults(t *testing.T) {
	t.Parallel()
	seen := map[[2]string]bool{}
	for _, p := range policy.Defaults() {
		require.NoError(t, p.Validate(), p.Name)
		key := [2]string{p.Kind, p.JobType}
		require.False(t, seen[key], "%s/%s twice", p.Kind, p.JobType)
		seen[key] = true
	}
	require.Equal(t, policy.Fallback(), policy.Defaults()[0])
	require.Equal(t, policy.AnyKind, policy.Fallback().Kind)
}
