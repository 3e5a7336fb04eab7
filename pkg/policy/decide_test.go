package policy_test

import (
	"math/rand/v2"
	"testing"
	"time"

	"github.com/stretchr/testify/require"

	"github.com/retryd/retryd/pkg/backoff"
	"github.com/retryd/retryd/pkg/contract"
	"github.com/retryd/retryd/pkg/errclass"
	"github.com/retryd/retryd/pkg/policy"
)

// fixedRand returns the lowest value of every range for 0 and the highest
// for -1.
type fixedRand int64

func (f fixedRand) Int64N(n int64) int64 {
	if f < 0 {
		return n - 1
	}
	return min(int64(f), n-1)
}

var failedAt = time.Date(2025, 3, 4, 10, 0, 0, 0, time.UTC)

// seedDefault is the '*' policy of the foundation migration.
func seedDefault() policy.Policy {
	p := policy.Fallback()
	p.Version = 2
	return p
}

// seedWith is seedDefault changed by change, when not nil.
func seedWith(change func(*policy.Policy)) policy.Policy {
	p := seedDefault()
	if change != nil {
		change(&p)
	}
	return p
}

// requireField asserts that err is nil when field is "", else that it is
// a *contract.FieldError for field wrapping contract.ErrInvalid.
func requireField(t *testing.T, err error, field string) {
	t.Helper()
	if field == "" {
		require.NoError(t, err)
		return
	}
	require.ErrorIs(t, err, contract.ErrInvalid)
	var fe *contract.FieldError
	require.ErrorAs(t, err, &fe)
	require.Equal(t, field, fe.Field)
}

func ms(v int64) time.Time  { return failedAt.Add(time.Duration(v) * time.Millisecond) }
func secs(s int) *time.Time { t := failedAt.Add(time.Duration(s) * time.Second); return &t }

func retryOutcome(attempt int, delayMS, baseMS int64, decidedBy string, retryCount, maxRetries int, class errclass.Class) policy.Outcome {
	return policy.Outcome{
		Retry:         true,
		NextAttemptAt: ms(delayMS),
		NextAttempt:   attempt + 1,
		Decision: contract.Decision{
			Policy: "default", PolicyVersion: 2, DecidedBy: decidedBy, ErrorClass: string(class),
			BaseDelayMS: baseMS, JitterMS: delayMS - baseMS, DelayMS: delayMS,
			RetryCount: retryCount, MaxRetries: maxRetries,
		},
	}
}

func exhaustedOutcome(reason string, class errclass.Class, retryCount, maxRetries int, note string) policy.Outcome {
	return policy.Outcome{
		ExhaustedReason: reason,
		Decision: contract.Decision{
			Policy: "default", PolicyVersion: 2, ErrorClass: string(class),
			RetryCount: retryCount, MaxRetries: maxRetries, Note: note,
		},
	}
}

func TestDecide(t *testing.T) {
	t.Parallel()
	withHint := func(o policy.Outcome, hintMS int64) policy.Outcome {
		o.Decision.RetryAfterMS = new(hintMS)
		return o
	}
	withNote := func(o policy.Outcome, note string) policy.Outcome {
		o.Decision.Note = note
		return o
	}
	withCap := func(o policy.Outcome) policy.Outcome {
		o.Decision.CappedBy = contract.CappedByMaxRetryAfter
		return o
	}
	tests := []struct {
		name   string
		policy func(*policy.Policy)
		in     policy.Input
		r      backoff.Rand
		want   policy.Outcome
	}{
		// backoff
		{
			name: "first failure, lowest jitter",
			in:   policy.Input{Attempt: 1, Class: errclass.Timeout},
			r:    fixedRand(0),
			want: retryOutcome(1, 1000, 1000, "backoff", 1, 3, errclass.Timeout),
		},
		{
			name: "first failure, highest jitter",
			in:   policy.Input{Attempt: 1, Class: errclass.Network},
			r:    fixedRand(-1),
			want: retryOutcome(1, 2000, 1000, "backoff", 1, 3, errclass.Network),
		},
		{
			name: "jitter truncated to whole milliseconds",
			in:   policy.Input{Attempt: 3, RetryCount: 2, Class: errclass.RateLimit},
			r:    fixedRand(int64(250*time.Millisecond + 999*time.Microsecond)),
			want: retryOutcome(3, 4250, 4000, "backoff", 3, 3, errclass.RateLimit),
		},
		{
			name: "last retry of the budget",
			in:   policy.Input{Attempt: 3, RetryCount: 2, Class: errclass.Temporary},
			r:    fixedRand(0),
			want: retryOutcome(3, 4000, 4000, "backoff", 3, 3, errclass.Temporary),
		},
		{
			name: "negative retry count counts as none",
			in:   policy.Input{Attempt: 1, RetryCount: -4, Class: errclass.Timeout},
			r:    fixedRand(0),
			want: retryOutcome(1, 1000, 1000, "backoff", 1, 3, errclass.Timeout),
		},
		{
			name: "huge retry count capped at max delay",
			in:   policy.Input{Attempt: 900_001, RetryCount: 900_000, Class: errclass.Timeout, MaxRetriesOverride: new(1_000_000)},
			r:    fixedRand(-1),
			want: retryOutcome(900_001, 301_000, 300_000, "backoff", 900_001, 1_000_000, errclass.Timeout),
		},
		// classes
		{
			name: "empty class is unknown and retried",
			in:   policy.Input{Attempt: 1},
			r:    fixedRand(0),
			want: retryOutcome(1, 1000, 1000, "backoff", 1, 3, errclass.Unknown),
		},
		{
			name: "unrecognised class is retried",
			in:   policy.Input{Attempt: 1, Class: "billing"},
			r:    fixedRand(0),
			want: retryOutcome(1, 1000, 1000, "backoff", 1, 3, "billing"),
		},
		{
			name: "listed non-retryable class",
			in:   policy.Input{Attempt: 1, Class: errclass.Validation},
			want: exhaustedOutcome("non_retryable", errclass.Validation, 0, 3, "class validation is not retried by policy default v2"),
		},
		{
			name:   "non-retryable by default without lists",
			policy: func(p *policy.Policy) { p.NonRetryableClasses = nil },
			in:     policy.Input{Attempt: 1, Class: errclass.Permission},
			want:   exhaustedOutcome("non_retryable", errclass.Permission, 0, 3, "class permission is not retried by policy default v2"),
		},
		{
			name: "retryable_classes makes a non-retryable class retryable",
			policy: func(p *policy.Policy) {
				p.NonRetryableClasses = []errclass.Class{errclass.Permission}
				p.RetryableClasses = []errclass.Class{errclass.Authentication}
			},
			in:   policy.Input{Attempt: 1, Class: errclass.Authentication},
			r:    fixedRand(0),
			want: retryOutcome(1, 1000, 1000, "backoff", 1, 3, errclass.Authentication),
		},
		{
			name:   "non_retryable_classes stops a retryable class",
			policy: func(p *policy.Policy) { p.NonRetryableClasses = []errclass.Class{errclass.Timeout} },
			in:     policy.Input{Attempt: 1, Class: errclass.Timeout},
			want:   exhaustedOutcome("non_retryable", errclass.Timeout, 0, 3, "class timeout is not retried by policy default v2"),
		},
		{
			name: "non_retryable_classes wins over retryable_classes",
			policy: func(p *policy.Policy) {
				p.RetryableClasses = []errclass.Class{errclass.Validation}
			},
			in:   policy.Input{Attempt: 1, Class: errclass.Validation},
			want: exhaustedOutcome("non_retryable", errclass.Validation, 0, 3, "class validation is not retried by policy default v2"),
		},
		{
			name:   "unknown listed as non-retryable stops empty classes",
			policy: func(p *policy.Policy) { p.NonRetryableClasses = []errclass.Class{errclass.Unknown} },
			in:     policy.Input{Attempt: 1},
			want:   exhaustedOutcome("non_retryable", errclass.Unknown, 0, 3, "class unknown is not retried by policy default v2"),
		},
		{
			name: "owner marked non-retryable",
			in:   policy.Input{Attempt: 2, RetryCount: 1, Class: errclass.Timeout, NonRetryable: true},
			want: exhaustedOutcome("non_retryable", errclass.Timeout, 1, 3, "the owner marked the error non-retryable"),
		},
		{
			name: "non-retryable wins over max retries",
			in:   policy.Input{Attempt: 4, RetryCount: 3, Class: errclass.Validation},
			want: exhaustedOutcome("non_retryable", errclass.Validation, 3, 3, "class validation is not retried by policy default v2"),
		},
		// budget
		{
			name: "max retries reached",
			in:   policy.Input{Attempt: 4, RetryCount: 3, Class: errclass.Timeout},
			want: exhaustedOutcome("max_retries", errclass.Timeout, 3, 3, "3 of 3 retries used"),
		},
		{
			name: "beyond max retries",
			in:   policy.Input{Attempt: 9, RetryCount: 8, Class: errclass.Timeout},
			want: exhaustedOutcome("max_retries", errclass.Timeout, 8, 3, "8 retries used, over the 3 allowed"),
		},
		{
			name: "override 0 stops at the first failure",
			in:   policy.Input{Attempt: 1, Class: errclass.Timeout, MaxRetriesOverride: new(0)},
			want: exhaustedOutcome("max_retries", errclass.Timeout, 0, 0, "0 of 0 retries used"),
		},
		{
			name: "negative override counts as 0",
			in:   policy.Input{Attempt: 1, Class: errclass.Timeout, MaxRetriesOverride: new(-2)},
			want: exhaustedOutcome("max_retries", errclass.Timeout, 0, 0, "0 of 0 retries used"),
		},
		{
			name: "override above the policy wins",
			in:   policy.Input{Attempt: 6, RetryCount: 5, Class: errclass.Timeout, MaxRetriesOverride: new(7)},
			r:    fixedRand(0),
			want: retryOutcome(6, 32000, 32000, "backoff", 6, 7, errclass.Timeout),
		},
		{
			name: "override below the policy wins",
			in:   policy.Input{Attempt: 2, RetryCount: 1, Class: errclass.Timeout, MaxRetriesOverride: new(1)},
			want: exhaustedOutcome("max_retries", errclass.Timeout, 1, 1, "1 of 1 retries used"),
		},
		{
			name:   "policy max 0",
			policy: func(p *policy.Policy) { p.MaxRetries = 0 },
			in:     policy.Input{Attempt: 1, Class: errclass.Timeout},
			want:   exhaustedOutcome("max_retries", errclass.Timeout, 0, 0, "0 of 0 retries used"),
		},
		// disabled
		{
			name:   "policy disabled",
			policy: func(p *policy.Policy) { p.Enabled = false },
			in:     policy.Input{Attempt: 1, Class: errclass.Timeout},
			want:   exhaustedOutcome("retries_disabled", errclass.Timeout, 0, 3, "retries are disabled by policy default v2"),
		},
		{
			name:   "policy disabled wins over an item enabling retries",
			policy: func(p *policy.Policy) { p.Enabled = false },
			in:     policy.Input{Attempt: 1, Class: errclass.Timeout, RetryEnabledOverride: new(true)},
			want:   exhaustedOutcome("retries_disabled", errclass.Timeout, 0, 3, "retries are disabled by policy default v2"),
		},
		{
			name: "item disables retries",
			in:   policy.Input{Attempt: 1, Class: errclass.Timeout, RetryEnabledOverride: new(false)},
			want: exhaustedOutcome("retries_disabled", errclass.Timeout, 0, 3, "retries are disabled for this item (retry_enabled=false)"),
		},
		{
			name: "item enables retries",
			in:   policy.Input{Attempt: 1, Class: errclass.Timeout, RetryEnabledOverride: new(true)},
			r:    fixedRand(0),
			want: retryOutcome(1, 1000, 1000, "backoff", 1, 3, errclass.Timeout),
		},
		{
			name: "disabled wins over non-retryable and budget",
			in:   policy.Input{Attempt: 5, RetryCount: 4, Class: errclass.Validation, NonRetryable: true, RetryEnabledOverride: new(false)},
			want: exhaustedOutcome("retries_disabled", errclass.Validation, 4, 3, "retries are disabled for this item (retry_enabled=false)"),
		},
		// retry-after hints
		{
			name: "relative hint replaces backoff and jitter",
			in:   policy.Input{Attempt: 1, Class: errclass.RateLimit, RetryAfter: contract.RetryAfterDuration(30 * time.Second)},
			r:    fixedRand(-1),
			want: withHint(retryOutcome(1, 30000, 30000, "retry_after", 1, 3, errclass.RateLimit), 30000),
		},
		{
			name: "absolute hint",
			in:   policy.Input{Attempt: 1, FailedAt: failedAt, Class: errclass.RateLimit, RetryAfter: contract.RetryAfterAt(*secs(90))},
			want: withHint(retryOutcome(1, 90000, 90000, "retry_after", 1, 3, errclass.RateLimit), 90000),
		},
		{
			name: "hint larger than max delay is honoured",
			in:   policy.Input{Attempt: 1, Class: errclass.RateLimit, RetryAfter: contract.RetryAfterDuration(time.Hour)},
			want: withHint(retryOutcome(1, 3600000, 3600000, "retry_after", 1, 3, errclass.RateLimit), 3600000),
		},
		{
			name: "hint larger than max_retry_after is capped",
			in:   policy.Input{Attempt: 1, Class: errclass.RateLimit, RetryAfter: contract.RetryAfterDuration(25 * time.Hour)},
			want: withCap(withNote(withHint(retryOutcome(1, 86400000, 86400000, "retry_after", 1, 3, errclass.RateLimit), 90000000),
				"retry-after hint of 90000000ms capped at the max_retry_after of 86400000ms")),
		},
		{
			name:   "policy's own max_retry_after",
			policy: func(p *policy.Policy) { p.MaxRetryAfter = 10 * time.Second },
			in:     policy.Input{Attempt: 1, Class: errclass.RateLimit, RetryAfter: contract.RetryAfterDuration(11 * time.Second)},
			want: withCap(withNote(withHint(retryOutcome(1, 10000, 10000, "retry_after", 1, 3, errclass.RateLimit), 11000),
				"retry-after hint of 11000ms capped at the max_retry_after of 10000ms")),
		},
		{
			name: "zero hint retries at once",
			in:   policy.Input{Attempt: 1, Class: errclass.Temporary, RetryAfter: contract.RetryAfterDuration(0)},
			want: withHint(retryOutcome(1, 0, 0, "retry_after", 1, 3, errclass.Temporary), 0),
		},
		{
			name: "negative hint retries at once",
			in:   policy.Input{Attempt: 1, Class: errclass.Temporary, RetryAfter: contract.RetryAfterDuration(-time.Minute)},
			want: withHint(retryOutcome(1, 0, 0, "retry_after", 1, 3, errclass.Temporary), 0),
		},
		{
			name: "hint in the past retries at once",
			in:   policy.Input{Attempt: 1, FailedAt: failedAt, Class: errclass.Temporary, RetryAfter: contract.RetryAfterAt(*secs(-60))},
			want: withHint(retryOutcome(1, 0, 0, "retry_after", 1, 3, errclass.Temporary), 0),
		},
		{
			name: "hint is recorded when exhausted",
			in:   policy.Input{Attempt: 4, RetryCount: 3, Class: errclass.RateLimit, RetryAfter: contract.RetryAfterDuration(5 * time.Second)},
			want: withHint(exhaustedOutcome("max_retries", errclass.RateLimit, 3, 3, "3 of 3 retries used"), 5000),
		},
		{
			name:   "hint with a zero max delay",
			policy: func(p *policy.Policy) { p.Backoff.Base, p.Backoff.Max = 0, 0 },
			in:     policy.Input{Attempt: 1, Class: errclass.RateLimit, RetryAfter: contract.RetryAfterDuration(time.Second)},
			want:   withHint(retryOutcome(1, 1000, 1000, "retry_after", 1, 3, errclass.RateLimit), 1000),
		},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			t.Parallel()
			got := decide(tt.policy, tt.in, tt.r)
			require.Equal(t, tt.want, got)
			require.Equal(t, got.Retry, got.ExhaustedReason == "")
		})
	}
}

// decide runs Decide on the seeded default policy, changed by change
// when not nil, for in failed at failedAt.
func decide(change func(*policy.Policy), in policy.Input, r backoff.Rand) policy.Outcome {
	in.FailedAt = failedAt
	return policy.Decide(seedWith(change), in, r)
}

func TestDecideSeededIsDeterministic(t *testing.T) {
	t.Parallel()
	p := seedDefault()
	p.Backoff = backoff.JobDefault()
	p.MaxRetries = 5
	run := func() []policy.Outcome {
		r := rand.New(rand.NewPCG(7, 11))
		var out []policy.Outcome
		for retry := range 6 {
			out = append(out, policy.Decide(p, policy.Input{Attempt: retry + 1, RetryCount: retry, FailedAt: failedAt, Class: errclass.Network}, r))
		}
		return out
	}
	a, b := run(), run()
	require.Equal(t, a, b)
	for i, o := range a[:5] {
		require.True(t, o.Retry, "retry %d", i)
		lo, hi := p.Backoff.Bounds(i)
		require.GreaterOrEqual(t, o.Decision.DelayMS, lo.Milliseconds())
		require.LessOrEqual(t, o.Decision.DelayMS, hi.Milliseconds())
	}
	require.Equal(t, contract.ExhaustedMaxRetries, a[5].ExhaustedReason)
}

// TestDecideProperties checks the invariants of every outcome over random
// policies and inputs from a seeded source.
func TestDecideProperties(t *testing.T) {
	t.Parallel()
	gen := rand.New(rand.NewPCG(84, 85))
	modes := []backoff.Jitter{backoff.JitterNone, backoff.JitterFull, backoff.JitterEqual, backoff.JitterAdditive}
	classes := append(errclass.Classes(), "")
	for range 5000 {
		base := time.Duration(gen.Int64N(int64(4 * time.Hour)))
		p := seedDefault()
		p.MaxRetries = gen.IntN(30)
		p.Enabled = gen.IntN(10) > 0
		p.Backoff = backoff.Config{
			Base: base, Max: base + time.Duration(gen.Int64N(int64(48*time.Hour))),
			Multiplier: 1 + 3*gen.Float64(), Jitter: modes[gen.IntN(len(modes))],
			JitterMax: time.Duration(gen.Int64N(int64(10 * time.Minute))),
		}
		require.NoError(t, p.Validate())
		in := policy.Input{
			Attempt: gen.IntN(40) + 1, RetryCount: gen.IntN(40) - 2, FailedAt: failedAt,
			Class: classes[gen.IntN(len(classes))],
		}
		if gen.IntN(3) == 0 {
			in.RetryAfter = contract.RetryAfterDuration(time.Duration(gen.Int64N(int64(72 * time.Hour))))
		}
		if gen.IntN(4) == 0 {
			in.MaxRetriesOverride = new(gen.IntN(40))
		}
		o := policy.Decide(p, in, gen)
		d := o.Decision
		require.Equal(t, o.Retry, o.ExhaustedReason == "")
		require.Equal(t, p.Name, d.Policy)
		require.Equal(t, p.EffectiveMaxRetries(in.MaxRetriesOverride), d.MaxRetries)
		if !o.Retry {
			require.True(t, o.NextAttemptAt.IsZero())
			require.Equal(t, max(in.RetryCount, 0), d.RetryCount)
			require.Empty(t, d.DecidedBy)
			continue
		}
		require.True(t, p.Enabled)
		require.True(t, p.Retryable(in.Class))
		require.LessOrEqual(t, d.RetryCount, d.MaxRetries)
		require.Equal(t, max(in.RetryCount, 0)+1, d.RetryCount)
		require.Equal(t, d.BaseDelayMS+d.JitterMS, d.DelayMS)
		require.Equal(t, time.Duration(d.DelayMS)*time.Millisecond, o.NextAttemptAt.Sub(failedAt))
		require.GreaterOrEqual(t, d.DelayMS, int64(0))
		if in.RetryAfter != nil {
			require.Zero(t, d.JitterMS)
			require.LessOrEqual(t, d.DelayMS, p.EffectiveMaxRetryAfter().Milliseconds())
			require.LessOrEqual(t, d.DelayMS, *d.RetryAfterMS)
			require.Equal(t, *d.RetryAfterMS > d.DelayMS, d.CappedBy == contract.CappedByMaxRetryAfter)
		} else {
			require.Equal(t, contract.DecidedByBackoff, d.DecidedBy)
			require.LessOrEqual(t, d.DelayMS, (p.Backoff.Max + p.Backoff.JitterMax).Milliseconds())
		}
	}
}

func BenchmarkDecide(b *testing.B) {
	p := seedDefault()
	r := rand.New(rand.NewPCG(1, 2))
	in := policy.Input{Attempt: 2, RetryCount: 1, FailedAt: failedAt, Class: errclass.Network}
	for b.Loop() {
		policy.Decide(p, in, r)
	}
}
