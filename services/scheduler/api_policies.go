package scheduler

import (
	"context"
	"errors"
	"fmt"
	"net/http"
	"slices"
	"time"

	"github.com/jackc/pgx/v5"

	"github.com/retryd/retryd/internal/audit"
	"github.com/retryd/retryd/internal/serve"
	"github.com/retryd/retryd/pkg/contract"
	"github.com/retryd/retryd/pkg/errclass"
	"github.com/retryd/retryd/pkg/policy"
	"github.com/retryd/retryd/stores/pgdb"
	"github.com/retryd/retryd/stores/retrystore"
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
	serve.Reply(w, PolicyList{Policies: ps}, err)
}

// PolicyList is GET /v1/policies.
type PolicyList struct {
	Policies []policy.Policy `json:"policies"`
}

// PolicyVersionList is GET /v1/policies/{kind}/{job_type}/versions,
// newest first.
type PolicyVersionList struct {
	Versions []retrystore.PolicyVersion `json:"versions"`
}

// handlePolicyTemplate answers policy.Template for ?kind= (default job)
// and ?job_type= (default: the kind's default policy).
func (s *Scheduler) handlePolicyTemplate(w http.ResponseWriter, r *http.Request) {
	kind, jobType := r.URL.Query().Get("kind"), r.URL.Query().Get("job_type")
	if kind == "" {
		kind = contract.KindJob
	}
	if err := contract.ValidateKind("kind", kind); err != nil {
		serve.WriteError(w, err)
		return
	}
	if jobType != "" {
		if err := contract.ValidateToken("job_type", jobType); err != nil {
			serve.WriteError(w, err)
			return
		}
	}
	serve.WriteJSON(w, http.StatusOK, policy.Template(kind, jobType))
}

func (s *Scheduler) handleGetPolicy(w http.ResponseWriter, r *http.Request) {
	policyRead(w, r, func(kind, jobType string) (any, error) {
		return retrystore.GetPolicy(r.Context(), s.cfg.Pool, kind, jobType)
	})
}

func (s *Scheduler) handlePolicyVersions(w http.ResponseWriter, r *http.Request) {
	policyRead(w, r, func(kind, jobType string) (any, error) {
		vs, err := retrystore.PolicyVersions(r.Context(), s.cfg.Pool, kind, jobType)
		if err == nil && len(vs) == 0 {
			err = pgdb.ErrNotFound
		}
		return PolicyVersionList{Versions: vs}, err
	})
}

// policyRead serves a read of the policy the path names: what read
// returns, or its error, where the store's pgdb.ErrNotFound is a 404
// naming the policy.
func policyRead(w http.ResponseWriter, r *http.Request, read func(kind, jobType string) (any, error)) {
	kind, jobType, err := pathPolicy(r)
	if err != nil {
		serve.WriteError(w, err)
		return
	}
	v, err := read(kind, jobType)
	if isNotFound(err) {
		err = fmt.Errorf("policy %s/%s: %w", kind, jobType, pgdb.ErrNotFound)
	}
	serve.Reply(w, v, err)
}

// PolicyRequest is the body of PUT /v1/policies/{kind}/{job_type}: a
// policy in its JSON form (policy.Policy's, as GET returns it), read over
// the defaults of a new policy so that fields left out take them:
// multiplier 2, jitter "additive", enabled true (policy.New), max_hold_ms and
// max_retry_after_ms 0 (30 days and 24 hours). max_retries, base_delay_ms
// and max_delay_ms are required. kind and job_type, when given, must be
// the path's; created_at and updated_at are the store's and ignored;
// updated_by is ignored (the token's name is recorded); version, when
// not 0, must be the current version (409 otherwise).
type PolicyRequest struct {
	Policy policy.Policy
}

// UnmarshalJSON reads the body strictly (policy.DecodeBody): a misspelt
// field is a 400, not a default.
func (req *PolicyRequest) UnmarshalJSON(data []byte) error {
	req.Policy = policy.New("", "")
	set, err := policy.DecodeBody(data, &req.Policy)
	if err != nil {
		return err
	}
	for _, name := range []string{"max_retries", "base_delay_ms", "max_delay_ms"} {
		if !slices.Contains(set, name) {
			return invalidField(name, "is required")
		}
	}
	return nil
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
	saved, err := s.PutPolicy(r.Context(), p, serve.Actor(r))
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

// policy is the policy to store at kind/jobType: the path's names, the
// classes by name (aliases such as validation_error are accepted), and
// the refusals that name the API's own defaults.
func (req PolicyRequest) policy(kind, jobType string) (policy.Policy, error) {
	p := req.Policy
	if p.Kind != "" && p.Kind != kind {
		return policy.Policy{}, invalidField("kind", fmt.Sprintf("is %q but the path names %q", p.Kind, kind))
	}
	if p.JobType != "" && p.JobType != jobType {
		return policy.Policy{}, invalidField("job_type", fmt.Sprintf("is %q but the path names %q", p.JobType, jobType))
	}
	p.Kind, p.JobType = kind, jobType
	p.CreatedAt, p.UpdatedAt = time.Time{}, time.Time{}
	if p.MaxHold < 0 {
		return policy.Policy{}, invalidField("max_hold_ms", fmt.Sprintf("must be positive (leave it out for 30 days), got %d", p.MaxHold.Milliseconds()))
	}
	if p.MaxRetryAfter < 0 {
		return policy.Policy{}, invalidField("max_retry_after_ms", fmt.Sprintf("must be positive (leave it out for 24 hours), got %d", p.MaxRetryAfter.Milliseconds()))
	}
	var err error
	if p.RetryableClasses, err = parseClasses("retryable_classes", p.RetryableClasses); err != nil {
		return policy.Policy{}, err
	}
	if p.NonRetryableClasses, err = parseClasses("non_retryable_classes", p.NonRetryableClasses); err != nil {
		return policy.Policy{}, err
	}
	byClass := make(map[errclass.Class]policy.ClassBackoff, len(p.ClassBackoff))
	for name, cb := range p.ClassBackoff {
		cl, err := errclass.Parse(string(name))
		if err != nil {
			return policy.Policy{}, invalidField("class_backoff", err.Error())
		}
		byClass[cl] = cb
	}
	p.ClassBackoff = byClass
	return p, nil
}

func parseClasses(field string, in []errclass.Class) ([]errclass.Class, error) {
	out := make([]errclass.Class, 0, len(in))
	for _, c := range in {
		cl, err := errclass.Parse(string(c))
		if err != nil {
			return nil, invalidField(field, err.Error())
		}
		out = append(out, cl)
	}
	return out, nil
}

// PutPolicy validates and stores a policy (creating it or bumping its
// version) and records the version. Decisions made after it returns use
// it. p.Version, when not 0, must be the current version (ErrConflict
// otherwise).
func (s *Scheduler) PutPolicy(ctx context.Context, p policy.Policy, changedBy string) (policy.Policy, error) {
	if changedBy == "" {
		changedBy = "api"
	}
	if len(changedBy) > contract.MaxTokenLen {
		return policy.Policy{}, invalidField("updated_by", fmt.Sprintf("is longer than %d characters", contract.MaxTokenLen))
	}
	check := p
	check.Version = max(p.Version, 1)
	if err := check.Validate(); err != nil {
		return policy.Policy{}, err
	}
	// The version and its audit entry are written together, or neither.
	var saved policy.Policy
	err := pgx.BeginFunc(ctx, s.cfg.Pool, func(tx pgx.Tx) error {
		var err error
		if saved, err = retrystore.PutPolicy(ctx, tx, p, changedBy); err != nil {
			return err
		}
		jobType := saved.JobType
		if jobType == "" {
			jobType = DefaultJobTypeNames[0] // as in the route: the kind's default
		}
		return audit.Record(ctx, tx, audit.PolicyPut, "policy/"+saved.Kind+"/"+jobType,
			audit.Detail{"version": saved.Version, "enabled": saved.Enabled})
	})
	if errors.Is(err, retrystore.ErrVersionConflict) {
		return policy.Policy{}, fmt.Errorf("%w: %w", ErrConflict, err)
	}
	if err != nil {
		return policy.Policy{}, err
	}
	s.log.Info().Str("kind", saved.Kind).Str("job_type", saved.JobType).Int("version", saved.Version).
		Str("by", changedBy).Msg("policy updated")
	return saved, nil
}
