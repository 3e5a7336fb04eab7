package main

import (
	"github.com/retryd/retryd/internal/audit"
	"github.com/retryd/retryd/internal/auth"
	"github.com/retryd/retryd/services/ingress"
	"github.com/retryd/retryd/services/jobs"
	"github.com/retryd/retryd/services/scheduler"
	"github.com/retryd/retryd/services/triggers"
	"github.com/retryd/retryd/stores/jobstore"
	"github.com/retryd/retryd/stores/retrystore"
)

// The API's answers as the CLI names them: each is the type the route
// itself encodes, so the CLI reads what the server writes and a field
// renamed there is renamed here. --json prints the answers as they came.

// retryPage is GET /v1/retries.
type retryPage = retrystore.Page

// retryView is GET /v1/retries/{kind}/{id} and a manual cancel or retry.
type retryView = scheduler.RetryView

// historyEntry is a lifecycle fact of a retry or a job.
type historyEntry = retrystore.HistoryEntry

// policyList is GET /v1/policies.
type policyList = scheduler.PolicyList

// policyVersionList is GET /v1/policies/{kind}/{job_type}/versions.
type policyVersionList = scheduler.PolicyVersionList

// policyVersion is a stored version of a policy.
type policyVersion = retrystore.PolicyVersion

// sourceView is GET /v1/sources/{source} and its updates.
type sourceView = ingress.SourceView

// sourceList is GET /v1/sources.
type sourceList = ingress.SourceList

// tokenList is GET /v1/tokens.
type tokenList = auth.TokenList

// analyticsView is GET /v1/analytics/retries: every kind's figures, then
// the job types' (docs/jobs.md, Retry analytics).
type analyticsView = jobstore.Analytics

// typeAnalytics are the figures of one job type.
type typeAnalytics = jobstore.TypeAnalytics

// dryRunView answers a dry run of POST /v1/jobs/bulk-retry.
type dryRunView = jobs.DryRunResponse

// operationView is GET /v1/operations/{id}, a bulk retry started, and a
// cancel.
type operationView = jobs.OperationResponse

// operationPage is GET /v1/operations.
type operationPage = jobstore.OperationPage

// auditPage is GET /v1/audit.
type auditPage = audit.Page

// jobPage is GET /v1/jobs.
type jobPage = jobstore.Page

// jobView is GET /v1/jobs/{id}. Job is null for a job the projection has
// not folded yet but the scheduler has history of.
type jobView = jobs.JobDetail

// jobActionView answers POST /v1/jobs/{id}/retry and /cancel.
type jobActionView = jobs.ActionResponse

// runPage is GET /v1/runs.
type runPage = triggers.RunPage

// runView is GET /v1/runs/{id}.
type runView = triggers.RunDetail

// scheduleView is GET /v1/schedules/{job_type}/{name} and its update.
type scheduleView = jobs.ScheduleView

// scheduleList is GET /v1/schedules.
type scheduleList = jobs.ScheduleList

// enqueued answers POST /v1/jobs.
type enqueued = jobs.EnqueueResponse
