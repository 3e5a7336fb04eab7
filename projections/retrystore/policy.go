package retrystore

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"github.com/retryd/retryd/pkg/policy"
	"time"

	"github.com/jackc/pgx/v5"
)

// Wildcard is the kind of the fallback policy used for kinds without one.
const Wildcard = "*"

// Defaults of retry_policies.max_hold_ms and max_retry_after_ms.
const (
	DefaultMaxHoldMS       = int64(30 * 24 * 60 * 60 * 1000)
	DefaultMaxRetryAfterMS = int64(24 * 60 * 60 * 1000)
)

// ErrVersionConflict is returned by PutPolicy when the caller expected a
// version that is no longer current.
var ErrVersionConflict = errors.New("policy version changed")

// Policy is a row of retry_policies. JobType "" is the kind's default;
// kind "*" with job type "" is the fallback for every kind.
type Policy struct {
	Kind                string   `json:"kind"`
	JobType             string   `json:"job_type"`
	Name                string   `json:"name"`
	Version             int      `json:"version"`
	MaxRetries          int      `json:"max_retries"`
	BaseDelayMS         int64    `json:"base_delay_ms"`
	Multiplier          float64  `json:"multiplier"`
	MaxDelayMS          int64    `json:"max_delay_ms"`
	Jitter              string   `json:"jitter"`
	JitterMS            int64    `json:"jitter_ms"`
	RetryableClasses    []string `json:"retryable_classes"`
	NonRetryableClasses []string `json:"non_retryable_classes"`
	Enabled             bool     `json:"enabled"`
	// MaxHoldMS bounds how long an item may be held back (throttled,
	// paused, waiting for a slot) before it is exhausted as hold_expired.
	MaxHoldMS int64 `json:"max_hold_ms"`
	// MaxRetryAfterMS bounds a failure's own retry-after hint.
	MaxRetryAfterMS int64 `json:"max_retry_after_ms"`
	// ClassBackoff gives error classes their own backoff, by class name.
	ClassBackoff map[string]ClassBackoff `json:"class_backoff"`
	UpdatedBy    string                  `json:"updated_by"`
	CreatedAt    time.Time               `json:"created_at"`
	UpdatedAt    time.Time               `json:"updated_at"`
}

// ClassBackoff is one error class's backoff in retry_policies.class_backoff:
// fields left out keep the policy's; FirstDelayMS is the class's first
// retry's delay, exactly (0: at once).
type ClassBackoff = policy.ClassBackoffMS

// PolicyVersion is a row of retry_policy_versions: the policy as it was
// from Version on.
type PolicyVersion struct {
	Kind      string          `json:"kind"`
	JobType   string          `json:"job_type"`
	Version   int             `json:"version"`
	Policy    json.RawMessage `json:"policy"`
	ChangedBy string          `json:"changed_by"`
	ChangedAt time.Time       `json:"changed_at"`
}

const policyColumns = `kind, job_type, name, version, max_retries, base_delay_ms, multiplier, max_delay_ms,
	jitter, jitter_ms, retryable_classes, non_retryable_classes, enabled, max_hold_ms, max_retry_after_ms,
	class_backoff, updated_by, created_at, updated_at`

func scanPolicy(row pgx.Row) (Policy, error) {
	var p Policy
	var classBackoff []byte
	err := row.Scan(&p.Kind, &p.JobType, &p.Name, &p.Version, &p.MaxRetries, &p.BaseDelayMS, &p.Multiplier,
		&p.MaxDelayMS, &p.Jitter, &p.JitterMS, &p.RetryableClasses, &p.NonRetryableClasses, &p.Enabled,
		&p.MaxHoldMS, &p.MaxRetryAfterMS, &classBackoff, &p.UpdatedBy, &p.CreatedAt, &p.UpdatedAt)
	if err == nil && len(classBackoff) > 0 {
		if jerr := json.Unmarshal(classBackoff, &p.ClassBackoff); jerr != nil {
			return Policy{}, fmt.Errorf("decode class_backoff of policy %s/%s: %w", p.Kind, p.JobType, jerr)
		}
	}
	if p.ClassBackoff == nil {
		p.ClassBackoff = map[string]ClassBackoff{}
	}
	if p.RetryableClasses == nil {
		p.RetryableClasses = []string{}
	}
	if p.NonRetryableClasses == nil {
		p.NonRetryableClasses = []string{}
	}
	return p, err
}

// LookupPolicy returns the policy that governs kind and jobType: the exact
// (kind, jobType) row, else the kind's default (kind, ""), else the
// fallback ("*", ""). ErrNotFound means none of them exists.
func LookupPolicy(ctx context.Context, q Querier, kind, jobType string) (Policy, error) {
	row := q.QueryRow(ctx, `SELECT `+policyColumns+` FROM retry_policies
WHERE (kind = $1 AND job_type IN ($2, '')) OR (kind = '*' AND job_type = '')
ORDER BY kind = '*', job_type = '' LIMIT 1`, kind, jobType)
	p, err := scanPolicy(row)
	if errors.Is(err, pgx.ErrNoRows) {
		return Policy{}, fmt.Errorf("look up policy %s/%s: %w", kind, jobType, ErrNotFound)
	}
	if err != nil {
		return Policy{}, fmt.Errorf("look up policy %s/%s: %w", kind, jobType, err)
	}
	return p, nil
}

// GetPolicy returns exactly the (kind, jobType) row.
func GetPolicy(ctx context.Context, q Querier, kind, jobType string) (Policy, error) {
	row := q.QueryRow(ctx, `SELECT `+policyColumns+` FROM retry_policies WHERE kind = $1 AND job_type = $2`, kind, jobType)
	p, err := scanPolicy(row)
	if errors.Is(err, pgx.ErrNoRows) {
		return Policy{}, fmt.Errorf("get policy %s/%s: %w", kind, jobType, ErrNotFound)
	}
	if err != nil {
		return Policy{}, fmt.Errorf("get policy %s/%s: %w", kind, jobType, err)
	}
	return p, nil
}

// ListPolicies returns every policy ordered by kind and job type.
func ListPolicies(ctx context.Context, q Querier) ([]Policy, error) {
	rows, err := q.Query(ctx, `SELECT `+policyColumns+` FROM retry_policies ORDER BY kind, job_type`)
	if err != nil {
		return nil, fmt.Errorf("list policies: %w", err)
	}
	defer rows.Close()
	out := []Policy{}
	for rows.Next() {
		p, err := scanPolicy(rows)
		if err != nil {
			return nil, fmt.Errorf("list policies: %w", err)
		}
		out = append(out, p)
	}
	if err := rows.Err(); err != nil {
		return nil, fmt.Errorf("list policies: %w", err)
	}
	return out, nil
}

// PutPolicy creates the (p.Kind, p.JobType) policy at version 1 or
// replaces it with the version after the current one, and records the new
// version in retry_policy_versions, in one statement. p.Version is the
// version the caller read: 0 skips the check, any other value that is not
// current returns ErrVersionConflict. Version, CreatedAt and UpdatedAt of
// p are otherwise ignored.
func PutPolicy(ctx context.Context, q Querier, p Policy, changedBy string) (Policy, error) {
	retryable, nonRetryable := p.RetryableClasses, p.NonRetryableClasses
	if retryable == nil {
		retryable = []string{}
	}
	if nonRetryable == nil {
		nonRetryable = []string{}
	}
	// 0 takes the column defaults (30 days, 24 hours).
	maxHold, maxRetryAfter := p.MaxHoldMS, p.MaxRetryAfterMS
	if maxHold <= 0 {
		maxHold = DefaultMaxHoldMS
	}
	if maxRetryAfter <= 0 {
		maxRetryAfter = DefaultMaxRetryAfterMS
	}
	classBackoff, err := json.Marshal(p.ClassBackoff)
	if err != nil {
		return Policy{}, fmt.Errorf("put policy %s/%s: encode class_backoff: %w", p.Kind, p.JobType, err)
	}
	if p.ClassBackoff == nil {
		classBackoff = []byte(`{}`)
	}
	row := q.QueryRow(ctx, `
WITH up AS (
	INSERT INTO retry_policies (kind, job_type, name, max_retries, base_delay_ms, multiplier,
		max_delay_ms, jitter, jitter_ms, retryable_classes, non_retryable_classes, enabled, updated_by,
		max_hold_ms, max_retry_after_ms, class_backoff)
	VALUES ($1, $2, $3, $4, $5, $6, $7, $8, $9, $10, $11, $12, $13, $15, $16, $17)
	ON CONFLICT (kind, job_type) DO UPDATE SET
		name = EXCLUDED.name, max_retries = EXCLUDED.max_retries, base_delay_ms = EXCLUDED.base_delay_ms,
		multiplier = EXCLUDED.multiplier, max_delay_ms = EXCLUDED.max_delay_ms, jitter = EXCLUDED.jitter,
		jitter_ms = EXCLUDED.jitter_ms, retryable_classes = EXCLUDED.retryable_classes,
		non_retryable_classes = EXCLUDED.non_retryable_classes, enabled = EXCLUDED.enabled,
		max_hold_ms = EXCLUDED.max_hold_ms, max_retry_after_ms = EXCLUDED.max_retry_after_ms,
		class_backoff = EXCLUDED.class_backoff,
		updated_by = EXCLUDED.updated_by, version = retry_policies.version + 1, updated_at = now()
	WHERE $14 = 0 OR retry_policies.version = $14
	RETURNING *
), ver AS (
	INSERT INTO retry_policy_versions (kind, job_type, version, policy, changed_by)
	SELECT kind, job_type, version, to_jsonb(up) - 'created_at' - 'updated_at', $13 FROM up
)
SELECT `+policyColumns+` FROM up`,
		p.Kind, p.JobType, p.Name, p.MaxRetries, p.BaseDelayMS, p.Multiplier, p.MaxDelayMS, p.Jitter,
		p.JitterMS, retryable, nonRetryable, p.Enabled, changedBy, p.Version, maxHold, maxRetryAfter, string(classBackoff))
	saved, err := scanPolicy(row)
	if errors.Is(err, pgx.ErrNoRows) {
		return Policy{}, fmt.Errorf("put policy %s/%s: expected version %d: %w", p.Kind, p.JobType, p.Version, ErrVersionConflict)
	}
	if err != nil {
		return Policy{}, fmt.Errorf("put policy %s/%s: %w", p.Kind, p.JobType, err)
	}
	return saved, nil
}

// PolicyVersions returns every recorded version of a policy, newest first.
func PolicyVersions(ctx context.Context, q Querier, kind, jobType string) ([]PolicyVersion, error) {
	rows, err := q.Query(ctx, `SELECT kind, job_type, version, policy, changed_by, changed_at
FROM retry_policy_versions WHERE kind = $1 AND job_type = $2 ORDER BY version DESC`, kind, jobType)
	if err != nil {
		return nil, fmt.Errorf("list policy versions %s/%s: %w", kind, jobType, err)
	}
	defer rows.Close()
	out := []PolicyVersion{}
	for rows.Next() {
		var v PolicyVersion
		if err := rows.Scan(&v.Kind, &v.JobType, &v.Version, (*[]byte)(&v.Policy), &v.ChangedBy, &v.ChangedAt); err != nil {
			return nil, fmt.Errorf("list policy versions %s/%s: %w", kind, jobType, err)
		}
		out = append(out, v)
	}
	if err := rows.Err(); err != nil {
		return nil, fmt.Errorf("list policy versions %s/%s: %w", kind, jobType, err)
	}
	return out, nil
}
