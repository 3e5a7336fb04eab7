package retrystore

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"time"

	"github.com/jackc/pgx/v5"

	"github.com/retryd/retryd/internal/pgrows"
	"github.com/retryd/retryd/pkg/errclass"
	"github.com/retryd/retryd/pkg/policy"
)

// Wildcard is the kind of the fallback policy used for kinds without one.
const Wildcard = policy.AnyKind

// ErrVersionConflict is returned by PutPolicy when the caller expected a
// version that is no longer current.
var ErrVersionConflict = errors.New("policy version changed")

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

// millis scans a bigint column of milliseconds into a Duration: the
// columns keep milliseconds, policy.Policy durations.
type millis struct{ d *time.Duration }

func (m millis) Scan(src any) error {
	ms, ok := src.(int64)
	if !ok {
		return fmt.Errorf("scan milliseconds: %T is not a bigint", src)
	}
	*m.d = policy.FromMS(ms)
	return nil
}

func scanPolicy(row pgx.Row) (policy.Policy, error) {
	var p policy.Policy
	var classBackoff []byte
	b := &p.Backoff
	err := row.Scan(&p.Kind, &p.JobType, &p.Name, &p.Version, &p.MaxRetries, millis{&b.Base}, &b.Multiplier,
		millis{&b.Max}, &b.Jitter, millis{&b.JitterMax}, &p.RetryableClasses, &p.NonRetryableClasses, &p.Enabled,
		millis{&p.MaxHold}, millis{&p.MaxRetryAfter}, &classBackoff, &p.UpdatedBy, &p.CreatedAt, &p.UpdatedAt)
	if err != nil {
		return policy.Policy{}, err
	}
	var byName map[string]policy.ClassBackoffMS
	if len(classBackoff) > 0 {
		if err := json.Unmarshal(classBackoff, &byName); err != nil {
			return policy.Policy{}, fmt.Errorf("decode class_backoff of policy %s/%s: %w", p.Kind, p.JobType, err)
		}
	}
	p.ClassBackoff = policy.ClassBackoffsFromMS(byName)
	return p, nil
}

// LookupPolicy returns the policy that governs kind and jobType: the exact
// (kind, jobType) row, else the kind's default (kind, ""), else the
// fallback ("*", ""). pgdb.ErrNotFound means none of them exists.
func LookupPolicy(ctx context.Context, q Querier, kind, jobType string) (policy.Policy, error) {
	return pgrows.One(ctx, q, "look up policy "+kind+"/"+jobType, scanPolicy, `SELECT `+policyColumns+` FROM retry_policies
WHERE (kind = $1 AND job_type IN ($2, '')) OR (kind = '*' AND job_type = '')
ORDER BY kind = '*', job_type = '' LIMIT 1`, kind, jobType)
}

// GetPolicy returns exactly the (kind, jobType) row.
func GetPolicy(ctx context.Context, q Querier, kind, jobType string) (policy.Policy, error) {
	return pgrows.One(ctx, q, "get policy "+kind+"/"+jobType, scanPolicy,
		`SELECT `+policyColumns+` FROM retry_policies WHERE kind = $1 AND job_type = $2`, kind, jobType)
}

// ListPolicies returns every policy ordered by kind and job type.
func ListPolicies(ctx context.Context, q Querier) ([]policy.Policy, error) {
	return pgrows.All(ctx, q, "list policies", scanPolicy, `SELECT `+policyColumns+` FROM retry_policies ORDER BY kind, job_type`)
}

// PutPolicy creates the (p.Kind, p.JobType) policy at version 1 or
// replaces it with the version after the current one, and records the new
// version in retry_policy_versions, in one statement. p.Version is the
// version the caller read: 0 skips the check, any other value that is not
// current returns ErrVersionConflict. Version, CreatedAt and UpdatedAt of
// p are otherwise ignored.
func PutPolicy(ctx context.Context, q Querier, p policy.Policy, changedBy string) (policy.Policy, error) {
	// 0 takes the defaults (30 days, 24 hours), which the columns hold
	// too.
	maxHold, maxRetryAfter := p.MaxHold, p.MaxRetryAfter
	if maxHold <= 0 {
		maxHold = policy.DefaultMaxHold
	}
	if maxRetryAfter <= 0 {
		maxRetryAfter = policy.DefaultMaxRetryAfter
	}
	classBackoff, err := json.Marshal(policy.ClassBackoffsToMS(p.ClassBackoff))
	if err != nil {
		return policy.Policy{}, fmt.Errorf("put policy %s/%s: encode class_backoff: %w", p.Kind, p.JobType, err)
	}
	b := p.Backoff
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
		p.Kind, p.JobType, p.Name, p.MaxRetries, b.Base.Milliseconds(), b.Multiplier, b.Max.Milliseconds(), string(b.Jitter),
		b.JitterMax.Milliseconds(), classNames(p.RetryableClasses), classNames(p.NonRetryableClasses), p.Enabled, changedBy,
		p.Version, maxHold.Milliseconds(), maxRetryAfter.Milliseconds(), string(classBackoff))
	saved, err := scanPolicy(row)
	if errors.Is(err, pgx.ErrNoRows) {
		return policy.Policy{}, fmt.Errorf("put policy %s/%s: expected version %d: %w", p.Kind, p.JobType, p.Version, ErrVersionConflict)
	}
	if err != nil {
		return policy.Policy{}, fmt.Errorf("put policy %s/%s: %w", p.Kind, p.JobType, err)
	}
	return saved, nil
}

// classNames is classes as text[]: empty, never NULL.
func classNames(classes []errclass.Class) []string {
	out := make([]string, len(classes))
	for i, c := range classes {
		out[i] = string(c)
	}
	return out
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
