package scheduler

import (
	"context"
	"errors"
	"fmt"
	"net/http"

	"github.com/retryd/retryd/internal/serve"
	"github.com/retryd/retryd/pkg/backoff"
	"github.com/retryd/retryd/pkg/contract"
	"github.com/retryd/retryd/pkg/errclass"
	"github.com/retryd/retryd/pkg/policy"
	"github.com/retryd/retryd/projections/retrystore"
)

// DefaultJobTypeNames are the path segments that mean "the kind's default
// policy" (job type ""): /v1/policies/event/_ or /v1/policies/event/default.
var DefaultJobTypeNames = []string{"_", "default"}

// pathPolicy reads {kind} and {job_type}; kind "*" is the fallback policy.
func pathPolicy(r *http.Request) (kind, jobType string, err error) {
	kind, jobType = r.PathValue("kind"), r.PathValue("job_type")
	if jobType == DefaultJobTypeNames[0] || jobType == DefaultJobTypeNames[1] {
		jobType = ""
	}
	if kind != retrystore.Wildcard {
		if err := contract.ValidateKind("kind", kind); err != nil {
			return "", "", err
		}
	} else if jobType != "" {
		return "", "", invalidField("job_type", `the fallback kind "*" only has a default policy: use "_"`)
	}
	if jobType != "" {
		if err := contract.ValidateToken("job_type", jobType); err != nil {
			return "", "", err
		}
	}
	return kind, jobType, nil
}

func (s *Scheduler) handleListPolicies(w http.ResponseWriter, r *http.Request) {
	ps, err := retrystore.ListPolicies(r.Context(), s.cfg.Pool)
	if err != nil {
		serve.WriteError(w, err)
		return
	}
	serve.WriteJSON(w, http.StatusOK, map[string]any{"policies": ps})
}

func (s *Scheduler) handleGetPolicy(w http.ResponseWriter, r *http.Request) {
	kind, jobType, err := pathPolicy(r)
	if err != nil {
		serve.WriteError(w, err)
		return
	}
	p, err := retrystore.GetPolicy(r.Context(), s.cfg.Pool, kind, jobType)
	if isNotFound(err) {
		err = fmt.Errorf("policy %s/%s: %w", kind, jobType, serve.ErrNotFound)
	}
	if err != nil {
		serve.WriteError(w, err)
		return
	}
	serve.WriteJSON(w, http.StatusOK, p)
}

func (s *Scheduler) handlePolicyVersions(w http.ResponseWriter, r *http.Request) {
	kind, jobType, err := pathPolicy(r)
	if err != nil {
		serve.WriteError(w, err)
		return
	}
	vs, err := retrystore.PolicyVersions(r.Context(), s.cfg.Pool, kind, jobType)
	if err == nil && len(vs) == 0 {
		err = fmt.Errorf("policy %s/%s: %w", kind, jobType, serve.ErrNotFound)
	}
	if err != nil {
		serve.WriteError(w, err)
		return
	}
	serve.WriteJSON(w, http.StatusOK, map[string]any{"versions": vs})
}

// PolicyRequest is the body of PUT /v1/policies/{kind}/{job_type}: the
// whole policy (fields left out take the defaults noted).
type PolicyRequest struct {
	Name        string   `json:"name"`
	MaxRetries  *int     `json:"max_retries"`
	BaseDelayMS *int64   `json:"base_delay_ms"`
	MaxDelayMS  *int64   `json:"max_delay_ms"`
	Multiplier  *float64 `json:"multiplier"` // default 2
	Jitter      string   `json:"jitter"`     // default "additive"
	JitterMS    int64    `json:"jitter_ms"`
	// Classes retried or not regardless of their default; names as in
	// errclass (aliases such as validation_error are accepted).
	RetryableClasses    []string `json:"retryable_classes"`
	NonRetryableClasses []string `json:"non_retryable_classes"`
	Enabled             *bool    `json:"enabled"` // default true
	// MaxHoldMS bounds how long an item may be held back (throttled,
	// paused, waiting for a slot) before it is exhausted as hold_expired
	// (default 30 days). MaxRetryAfterMS bounds a failure's own
	// retry-after hint (default 24 hours).
	MaxHoldMS       int64 `json:"max_hold_ms"`
	MaxRetryAfterMS int64 `json:"max_retry_after_ms"`
	// ClassBackoff gives error classes (names as in errclass, aliases
	// accepted) their own backoff; fields left out keep the policy's.
	ClassBackoff map[string]retrystore.ClassBackoff `json:"class_backoff"`
	// Version, when set, must be the current version (optimistic
	// concurrency: 409 if someone changed the policy meanwhile).
	Version   int    `json:"version"`
	UpdatedBy string `json:"updated_by"` // default "api"
}

func (s *Scheduler) handlePutPolicy(w http.ResponseWriter, r *http.Request) {
	kind, jobType, err := pathPolicy(r)
	if err != nil {
		serve.WriteError(w, err)
		return
	}
	var req PolicyRequest
	if err := serve.DecodeJSON(r, maxBodyBytes, &req); err != nil {
		serve.WriteError(w, err)
		return
	}
	p, err := req.policy(kind, jobType)
	if err != nil {
		serve.WriteError(w, err)
		return
	}
	saved, err := s.PutPolicy(r.Context(), p, req.UpdatedBy)
	if err != nil {
		serve.WriteError(w, err)
		return
	}
	status := http.StatusOK
	if saved.Version == 1 {
		status = http.StatusCreated
	}
	serve.WriteJSON(w, status, saved)
}

func (req PolicyRequest) policy(kind, jobType string) (retrystore.Policy, error) {
	for _, f := range []struct {
		name    string
		missing bool
	}{{"max_retries", req.MaxRetries == nil}, {"base_delay_ms", req.BaseDelayMS == nil}, {"max_delay_ms", req.MaxDelayMS == nil}} {
		if f.missing {
			return retrystore.Policy{}, invalidField(f.name, "is required")
		}
	}
	p := retrystore.Policy{
		Kind: kind, JobType: jobType, Name: req.Name, Version: req.Version, MaxRetries: *req.MaxRetries,
		BaseDelayMS: *req.BaseDelayMS, MaxDelayMS: *req.MaxDelayMS, Multiplier: 2, Jitter: string(backoff.JitterAdditive),
		JitterMS: req.JitterMS, Enabled: true, MaxHoldMS: req.MaxHoldMS, MaxRetryAfterMS: req.MaxRetryAfterMS,
	}
	if req.MaxHoldMS < 0 {
		return retrystore.Policy{}, invalidField("max_hold_ms", fmt.Sprintf("must be positive (leave it out for 30 days), got %d", req.MaxHoldMS))
	}
	if req.MaxRetryAfterMS < 0 {
		return retrystore.Policy{}, invalidField("max_retry_after_ms", fmt.Sprintf("must be positive (leave it out for 24 hours), got %d", req.MaxRetryAfterMS))
	}
	if req.Multiplier != nil {
		p.Multiplier = *req.Multiplier
	}
	if req.Jitter != "" {
		p.Jitter = req.Jitter
	}
	if req.Enabled != nil {
		p.Enabled = *req.Enabled
	}
	var err error
	if p.RetryableClasses, err = parseClasses("retryable_classes", req.RetryableClasses); err != nil {
		return retrystore.Policy{}, err
	}
	if p.NonRetryableClasses, err = parseClasses("non_retryable_classes", req.NonRetryableClasses); err != nil {
		return retrystore.Policy{}, err
	}
	p.ClassBackoff = make(map[string]retrystore.ClassBackoff, len(req.ClassBackoff))
	for name, cb := range req.ClassBackoff {
		cl, err := errclass.Parse(name)
		if err != nil {
			return retrystore.Policy{}, invalidField("class_backoff", err.Error())
		}
		p.ClassBackoff[string(cl)] = cb
	}
	return p, nil
}

func parseClasses(field string, in []string) ([]string, error) {
	out := make([]string, 0, len(in))
	for _, c := range in {
		cl, err := errclass.Parse(c)
		if err != nil {
			return nil, invalidField(field, err.Error())
		}
		out = append(out, string(cl))
	}
	return out, nil
}

// PutPolicy validates and stores a policy (creating it or bumping its
// version) and records the version. Decisions made after it returns use
// it. p.Version, when not 0, must be the current version (ErrConflict
// otherwise).
func (s *Scheduler) PutPolicy(ctx context.Context, p retrystore.Policy, changedBy string) (retrystore.Policy, error) {
	if changedBy == "" {
		changedBy = "api"
	}
	if len(changedBy) > contract.MaxTokenLen {
		return retrystore.Policy{}, invalidField("updated_by", fmt.Sprintf("is longer than %d characters", contract.MaxTokenLen))
	}
	check := toPolicy(p)
	check.Version = max(p.Version, 1)
	if p.Kind == retrystore.Wildcard {
		check.Kind = policy.AnyKind
	}
	if err := check.Validate(); err != nil {
		return retrystore.Policy{}, err
	}
	saved, err := retrystore.PutPolicy(ctx, s.cfg.Pool, p, changedBy)
	if errors.Is(err, retrystore.ErrVersionConflict) {
		return retrystore.Policy{}, fmt.Errorf("%w: %w", ErrConflict, err)
	}
	if err != nil {
		return retrystore.Policy{}, err
	}
	s.log.Info().Str("kind", saved.Kind).Str("job_type", saved.JobType).Int("version", saved.Version).
		Str("by", changedBy).Msg("policy updated")
	return saved, nil
}
