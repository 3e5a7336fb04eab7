package main

import (
	"encoding/json"
	"time"

	"github.com/retryd/retryd/internal/auth"
	"github.com/retryd/retryd/pkg/policy"
)

// The API's answers as the CLI reads them. Only the fields it shows are
// decoded; --json prints the answers whole.

type retryRow struct {
	Kind             string            `json:"kind"`
	ID               string            `json:"id"`
	State            string            `json:"state"`
	Attempt          int               `json:"attempt"`
	RetryCount       int               `json:"retry_count"`
	MaxRetries       int               `json:"max_retries"`
	RetryEnabled     bool              `json:"retry_enabled"`
	JobType          string            `json:"job_type"`
	Source           string            `json:"source"`
	PolicyName       string            `json:"policy_name"`
	PolicyVersion    int               `json:"policy_version"`
	NextAttemptAt    *time.Time        `json:"next_attempt_at"`
	DueAt            *time.Time        `json:"due_at"`
	LastErrorClass   string            `json:"last_error_class"`
	LastErrorMessage string            `json:"last_error_message"`
	LastErrorAt      *time.Time        `json:"last_error_at"`
	LastReason       string            `json:"last_reason"`
	ExhaustedReason  string            `json:"exhausted_reason"`
	HeldSince        *time.Time        `json:"held_since"`
	HoldReason       string            `json:"hold_reason"`
	HoldKey          string            `json:"hold_key"`
	Metadata         map[string]string `json:"metadata"`
	CreatedAt        time.Time         `json:"created_at"`
	UpdatedAt        time.Time         `json:"updated_at"`
	ResolvedAt       *time.Time        `json:"resolved_at"`
}

type retryPage struct {
	Retries    []retryRow `json:"retries"`
	NextCursor string     `json:"next_cursor"`
}

type historyEntry struct {
	Attempt       int             `json:"attempt"`
	Event         string          `json:"event"`
	ErrorClass    string          `json:"error_class"`
	ErrorMessage  string          `json:"error_message"`
	DelayMS       *int64          `json:"delay_ms"`
	DecidedBy     string          `json:"decided_by"`
	PolicyName    string          `json:"policy_name"`
	PolicyVersion int             `json:"policy_version"`
	NextAttemptAt *time.Time      `json:"next_attempt_at"`
	Detail        json.RawMessage `json:"detail"`
	MsgID         string          `json:"msg_id"`
	Executor      string          `json:"executor"`
	At            time.Time       `json:"at"`
}

type retryView struct {
	Retry   retryRow       `json:"retry"`
	History []historyEntry `json:"history"`
}

type sourceView struct {
	Source       string     `json:"source"`
	RateLimit    *int       `json:"rate_limit"`
	RateWindow   string     `json:"rate_window"`
	Paused       bool       `json:"paused"`
	PausedUntil  *time.Time `json:"paused_until"`
	PauseReason  string     `json:"pause_reason"`
	AllowedTypes []string   `json:"allowed_types"`
	Deferred     int64      `json:"deferred"`
	UpdatedBy    string     `json:"updated_by"`
	UpdatedAt    time.Time  `json:"updated_at"`
}

// policyList is GET /v1/policies.
type policyList struct {
	Policies []policy.Policy `json:"policies"`
}

// policyVersionList is GET /v1/policies/{kind}/{job_type}/versions.
type policyVersionList struct {
	Versions []policyVersion `json:"versions"`
}

// sourceList is GET /v1/sources.
type sourceList struct {
	Sources []sourceView `json:"sources"`
}

// tokenList is GET /v1/tokens.
type tokenList struct {
	Tokens []auth.Token `json:"tokens"`
}

// dryRunView answers a dry run of POST /v1/jobs/bulk-retry.
type dryRunView struct {
	Matched int64 `json:"matched"`
}

type policyVersion struct {
	Version   int             `json:"version"`
	Policy    json.RawMessage `json:"policy"`
	ChangedBy string          `json:"changed_by"`
	ChangedAt time.Time       `json:"changed_at"`
}

// analyticsView is GET /v1/analytics/retries: every kind's figures, then
// the job types' (docs/jobs.md, Retry analytics).
type analyticsView struct {
	Since        time.Time       `json:"since"`
	Until        time.Time       `json:"until"`
	CompleteFrom *time.Time      `json:"complete_from"`
	Partial      bool            `json:"partial"`
	Kinds        []kindAnalytics `json:"kinds"`
	JobTypes     []typeAnalytics `json:"job_types"`
}

// classCount is a count of failures of one error class.
type classCount struct {
	Class string `json:"class"`
	Count int64  `json:"count"`
}

type typeAnalytics struct {
	JobType              string           `json:"job_type"`
	TotalJobs            int64            `json:"total_jobs"`
	ByStatus             map[string]int64 `json:"by_status"`
	Succeeded            int64            `json:"succeeded"`
	Failed               int64            `json:"failed"`
	SuccessRate          *float64         `json:"success_rate"`
	AvgAttemptsToSuccess *float64         `json:"avg_attempts_to_success"`
	TimeToSuccessMS      struct {
		P50 *float64 `json:"p50"`
		P90 *float64 `json:"p90"`
		P99 *float64 `json:"p99"`
	} `json:"time_to_success_ms"`
	TotalRetries      int64    `json:"total_retries"`
	RetriedJobs       int64    `json:"retried_jobs"`
	RetriedSucceeded  int64    `json:"retried_succeeded"`
	RetrySuccessRate  *float64 `json:"retry_success_rate"`
	RetryDistribution []struct {
		Retries int   `json:"retries"`
		Jobs    int64 `json:"jobs"`
	} `json:"retry_distribution"`
	ErrorsByClass []classCount `json:"errors_by_class"`
	TopErrors     []struct {
		Pattern string `json:"pattern"`
		Class   string `json:"class"`
		Count   int64  `json:"count"`
	} `json:"top_errors"`
}

type operationView struct {
	Operation operationSummary `json:"operation"`
	Problems  []struct {
		JobID string `json:"job_id"`
		State string `json:"state"`
		Error string `json:"error"`
	} `json:"problems"`
}

type auditEntry struct {
	At        time.Time       `json:"at"`
	Principal string          `json:"principal"`
	Role      string          `json:"role"`
	Action    string          `json:"action"`
	Target    string          `json:"target"`
	Detail    json.RawMessage `json:"detail"`
}

type auditPage struct {
	Entries    []auditEntry `json:"entries"`
	NextCursor string       `json:"next_cursor,omitempty"`
}

type jobRow struct {
	ID                 string     `json:"id"`
	JobType            string     `json:"job_type"`
	Status             string     `json:"status"`
	Priority           string     `json:"priority,omitempty"`
	Attempt            int        `json:"attempt"`
	RetryCount         int        `json:"retry_count"`
	MaxRetries         *int       `json:"max_retries"`
	RetryEnabled       bool       `json:"retry_enabled"`
	CurrentStep        string     `json:"current_step"`
	LastErrorMessage   string     `json:"last_error_message"`
	LastErrorClass     string     `json:"last_error_class"`
	LastErrorTimestamp *time.Time `json:"last_error_timestamp"`
	LastAttemptAt      *time.Time `json:"last_attempt_at"`
	NextRetryAt        *time.Time `json:"next_retry_at"`
	StatusReason       string     `json:"status_reason"`
	CreatedAt          time.Time  `json:"created_at"`
	UpdatedAt          time.Time  `json:"updated_at"`
	CompletedAt        *time.Time `json:"completed_at"`
}

type jobPage struct {
	Jobs       []jobRow `json:"jobs"`
	NextCursor string   `json:"next_cursor,omitempty"`
}

// jobView is GET /v1/jobs/{id}. Job is null for a job the projection has
// not folded yet but the scheduler has history of.
type jobView struct {
	Job     *jobRow        `json:"job"`
	History []historyEntry `json:"history"`
}

// jobActionView answers POST /v1/jobs/{id}/retry and /cancel.
type jobActionView struct {
	ID     string `json:"id"`
	Action string `json:"action"`
	By     string `json:"by"`
	Reason string `json:"reason"`
}
