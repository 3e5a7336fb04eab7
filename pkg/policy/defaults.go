package policy

import (
	"time"

	"github.com/retryd/retryd/pkg/backoff"
	"github.com/retryd/retryd/pkg/contract"
	"github.com/retryd/retryd/pkg/errclass"
)

// New is a policy for kind and jobType before its name, retries and
// delays are set: the values the policy API gives fields a request leaves
// out (multiplier 2, additive jitter, enabled; holds and retry-after
// hints at their defaults), so that a client building a policy and the
// API filling one in agree.
func New(kind, jobType string) Policy {
	return Policy{
		Kind: kind, JobType: jobType, Enabled: true,
		Backoff: backoff.Config{Multiplier: 2, Jitter: backoff.JitterAdditive},
	}
}

// seeded is a policy as the migrations install it: version 1, enabled,
// the classes that need a person to fix them not retried, and the
// column defaults for holds and retry-after hints.
func seeded(kind, jobType, name string, maxRetries int, b backoff.Config) Policy {
	return Policy{
		Kind: kind, JobType: jobType, Name: name, Version: 1, MaxRetries: maxRetries, Backoff: b,
		NonRetryableClasses: []errclass.Class{errclass.Authentication, errclass.Permission, errclass.Validation},
		Enabled:             true, MaxHold: DefaultMaxHold, MaxRetryAfter: DefaultMaxRetryAfter,
	}
}

// additive is a backoff with additive jitter, the jitter of every seeded
// policy.
func additive(base time.Duration, multiplier float64, maxDelay, jitter time.Duration) backoff.Config {
	return backoff.Config{Base: base, Max: maxDelay, Multiplier: multiplier, Jitter: backoff.JitterAdditive, JitterMax: jitter}
}

// Fallback is the seeded policy of kind AnyKind, which governs kinds
// without a policy of their own: 3 retries on backoff.Default().
func Fallback() Policy {
	return seeded(AnyKind, "", "default", 3, backoff.Default())
}

// Template is where a new policy for kind and jobType starts: the
// fallback policy's values under that key, with no name or version yet.
// The dashboard's editor starts from it (GET /v1/policies/template), so
// its starting values and the seeded ones cannot drift apart.
func Template(kind, jobType string) Policy {
	p := Fallback()
	p.Kind, p.JobType, p.Name, p.Version = kind, jobType, "", 0
	return p
}

// Defaults returns the policies the migrations install, ordered by kind and
// job type as the store lists them. migrations/sql/00001_foundation.sql
// holds the same rows; a test of the migrations compares the two, so
// neither can change alone.
func Defaults() []Policy {
	return []Policy{
		Fallback(),
		seeded(contract.KindEvent, "", "event-ingress", 20, backoff.Default()),
		seeded(contract.KindEventTrigger, "", "event-trigger", 20, backoff.Default()),
		seeded(contract.KindJob, "", "job-default", 5, backoff.JobDefault()),
		seeded(contract.KindJob, "data_enrichment", "data-enrichment", 5, additive(5*time.Minute, 2, time.Hour, time.Minute)),
		seeded(contract.KindJob, "email_campaign", "email-campaign", 4, additive(30*time.Minute, 2, 6*time.Hour, 5*time.Minute)),
		seeded(contract.KindJob, "linkedin_outreach", "linkedin-outreach", 3, additive(time.Hour, 1.5, 12*time.Hour, 5*time.Minute)),
		seeded(contract.KindJob, "workflow_step", "workflow-step", 3, backoff.Default()),
		// 00107_run_policy.sql: seed 003's run retries.
		seeded(contract.KindRun, "", "workflow_run", 3, backoff.Default()),
	}
}
