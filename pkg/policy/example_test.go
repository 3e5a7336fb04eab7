package policy_test

import (
	"fmt"
	"math/rand/v2"
	"time"

	"github.com/retryd/retryd/pkg/backoff"
	"github.com/retryd/retryd/pkg/contract"
	"github.com/retryd/retryd/pkg/errclass"
	"github.com/retryd/retryd/pkg/policy"
)

func ExampleDecide() {
	p := policy.Policy{
		Kind: "job", Name: "job-default", Version: 1, MaxRetries: 5,
		Backoff:             backoff.JobDefault(),
		NonRetryableClasses: []errclass.Class{errclass.Authentication, errclass.Permission, errclass.Validation},
		Enabled:             true,
	}
	failedAt := time.Date(2025, 1, 1, 12, 0, 0, 0, time.UTC)
	r := rand.New(rand.NewPCG(1, 2)) // the scheduler passes nil: the default source

	// Attempt 2 failed with a network error: the second retry, 4h plus jitter.
	o := policy.Decide(p, policy.Input{Attempt: 2, RetryCount: 1, FailedAt: failedAt, Class: errclass.Network}, r)
	fmt.Println(o.Retry, o.NextAttempt, o.Decision.DecidedBy, o.Decision.BaseDelayMS, o.Decision.RetryCount)

	// The API said "Retry-After: 600": the hint replaces backoff.
	o = policy.Decide(p, policy.Input{Attempt: 2, RetryCount: 1, FailedAt: failedAt, Class: errclass.RateLimit,
		RetryAfter: contract.RetryAfterDuration(10 * time.Minute)}, r)
	fmt.Println(o.Retry, o.NextAttemptAt.Format(time.TimeOnly), o.Decision.DecidedBy)

	// Bad credentials are not retried.
	o = policy.Decide(p, policy.Input{Attempt: 1, FailedAt: failedAt, Class: errclass.Authentication}, r)
	fmt.Println(o.Retry, o.ExhaustedReason)

	// The job allowed 2 retries and both are used.
	o = policy.Decide(p, policy.Input{Attempt: 3, RetryCount: 2, FailedAt: failedAt, Class: errclass.Timeout, MaxRetriesOverride: new(2)}, r)
	fmt.Println(o.Retry, o.ExhaustedReason, o.Decision.Note)
	// Output:
	// true 3 backoff 14400000 2
	// true 12:10:00 retry_after
	// false non_retryable
	// false max_retries 2 of 2 retries used
}

func ExampleSimulate() {
	p := policy.Policy{Name: "default", Backoff: backoff.Default()}
	for _, s := range policy.Simulate(p, 10) {
		fmt.Printf("retry %2d (attempt %2d): %v to %v, total %v to %v\n",
			s.Retry, s.Attempt, s.MinDelay, s.MaxDelay, s.CumulativeMin, s.CumulativeMax)
	}
	// Output:
	// retry  1 (attempt  2): 1s to 2s, total 1s to 2s
	// retry  2 (attempt  3): 2s to 3s, total 3s to 5s
	// retry  3 (attempt  4): 4s to 5s, total 7s to 10s
	// retry  4 (attempt  5): 8s to 9s, total 15s to 19s
	// retry  5 (attempt  6): 16s to 17s, total 31s to 36s
	// retry  6 (attempt  7): 32s to 33s, total 1m3s to 1m9s
	// retry  7 (attempt  8): 1m4s to 1m5s, total 2m7s to 2m14s
	// retry  8 (attempt  9): 2m8s to 2m9s, total 4m15s to 4m23s
	// retry  9 (attempt 10): 4m16s to 4m17s, total 8m31s to 8m40s
	// retry 10 (attempt 11): 5m0s to 5m1s, total 13m31s to 13m41s
}
