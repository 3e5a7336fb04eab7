package jobs

import (
	"context"
	"errors"
	"fmt"
	"net/http"
	"net/url"
	"os"
	"strconv"
	"strings"
	"sync"
	"time"

	"github.com/jackc/pgx/v5/pgxpool"
	"github.com/nats-io/nats.go/jetstream"
	"github.com/prometheus/client_golang/prometheus"
	"github.com/rs/zerolog"

	"github.com/retryd/retryd/internal/audit"
	"github.com/retryd/retryd/internal/serve"
	"github.com/retryd/retryd/pkg/contract"
	"github.com/retryd/retryd/pkg/errclass"
	"github.com/retryd/retryd/stores/jobstore"
	"github.com/retryd/retryd/stores/pgdb"
	"github.com/retryd/retryd/stores/pgtext"
	"github.com/retryd/retryd/stores/retrystore"
)

// RetryController is what the jobs API needs from the scheduler: a manual
// retry and a cancel of one item. The scheduler's methods fit it through a
// small adapter (see docs/jobs.md). Errors wrapping pgdb.ErrNotFound,
// pgdb.ErrConflict or contract.ErrInvalid answer 404, 409 and 400.
type RetryController interface {
	// RetryNow schedules a new attempt of kind/id now. errorClass, when
	// not empty, is the class the operator gives the retry (a valid
	// errclass.Class): it is recorded with the manual decision.
	RetryNow(ctx context.Context, kind, id, reason, by string, resetAttempts bool, errorClass string) error
	// Cancel cancels the pending retry of kind/id.
	Cancel(ctx context.Context, kind, id, by, reason string) error
}

// Defaults of APIConfig.
const (
	DefaultMaxBodyBytes  = 64 << 10
	DefaultLeaseTTL      = 30 * time.Second
	DefaultScanInterval  = 5 * time.Second
	DefaultRatePerSecond = 10
	MaxRatePerSecond     = 1000
	DefaultAnalyticsDays = 7
)

// APIConfig configures the jobs API. Pool, Retry and JS are required.
type APIConfig struct {
	Pool  *pgxpool.Pool
	Retry RetryController
	// JS publishes the jobs of POST /v1/jobs and keeps the schedules on
	// the SCHEDULES stream.
	JS jetstream.JetStream
	// Logger gets ids, types and counts, never error messages of jobs.
	Logger zerolog.Logger
	// Registerer receives the bulk retry metrics; nil means a private
	// registry.
	Registerer prometheus.Registerer
	// Runner names this process in bulk retry leases; default
	// "<hostname>-<pid>".
	Runner string
	// LeaseTTL is how long a bulk retry stays with a runner that stopped
	// renewing it (crashed) before another runner resumes it. Default 30s.
	LeaseTTL time.Duration
	// ScanInterval is how often the runner looks for bulk retries to run
	// or resume. Default 5s.
	ScanInterval time.Duration
	// MaxBodyBytes caps request bodies. Default 64 KiB.
	MaxBodyBytes int64
	// Now is the clock for analytics periods, for tests. Default time.Now.
	Now func() time.Time
}

func (c *APIConfig) validate() error {
	switch {
	case c.Pool == nil:
		return errors.New("APIConfig.Pool is required")
	case c.Retry == nil:
		return errors.New("APIConfig.Retry is required")
	case c.JS == nil:
		return errors.New("APIConfig.JS is required")
	case c.LeaseTTL < 0:
		return fmt.Errorf("APIConfig.LeaseTTL must not be negative, got %s", c.LeaseTTL)
	case c.ScanInterval < 0:
		return fmt.Errorf("APIConfig.ScanInterval must not be negative, got %s", c.ScanInterval)
	case c.MaxBodyBytes < 0:
		return fmt.Errorf("APIConfig.MaxBodyBytes must not be negative, got %d", c.MaxBodyBytes)
	}
	if c.Runner == "" {
		host, _ := os.Hostname()
		c.Runner = fmt.Sprintf("%s-%d", host, os.Getpid())
	}
	if c.LeaseTTL == 0 {
		c.LeaseTTL = DefaultLeaseTTL
	}
	if c.ScanInterval == 0 {
		c.ScanInterval = DefaultScanInterval
	}
	if c.MaxBodyBytes == 0 {
		c.MaxBodyBytes = DefaultMaxBodyBytes
	}
	if c.Registerer == nil {
		c.Registerer = prometheus.NewRegistry()
	}
	if c.Now == nil {
		c.Now = time.Now
	}
	return nil
}

// API serves the jobs, analytics and bulk retry endpoints and runs bulk
// retries in the background (Start/Stop):
//
//	GET  /v1/analytics/retries?kind=&job_type=&since=&until=&days=&top=
//	POST /v1/jobs                {"job_type": "...", "payload": {...}, "run_at": "...", "unique_for": "24h"}
//	GET  /v1/jobs?status=&job_type=&priority=&min_retry_count=&error_class=&since=&until=&limit=&cursor=
//	GET  /v1/jobs/{id}
//	POST /v1/jobs/{id}/retry     {"reason": "...", "by": "...", "reset_attempts": false, "error_class": "..."}
//
// The names of the puppet retry API are accepted as aliases (docs/jobs.md,
// "Puppet API names"): jobType for job_type, status=permanently_failed for
// failed,failed_max_retries and errorType for error_class.
//
//	POST /v1/jobs/{id}/cancel    {"reason": "...", "by": "..."}
//	POST /v1/jobs/bulk-retry     {"filter": {...}, "dry_run": true, "rate_per_second": 5, "reason": "..."}
//	GET  /v1/operations?status=&limit=&cursor=
//	GET  /v1/operations/{id}
//	POST /v1/operations/{id}/cancel
//	GET|PUT|DELETE /v1/schedules/{job_type}/{name}, GET /v1/schedules
type API struct {
	cfg APIConfig
	log zerolog.Logger
	m   *apiMetrics

	lifecycle
	wg      sync.WaitGroup
	running map[string]bool // operations with a local runner goroutine
	kick    chan struct{}
}

// NewAPI validates cfg and returns the API.
func NewAPI(cfg APIConfig) (*API, error) {
	if err := cfg.validate(); err != nil {
		return nil, fmt.Errorf("new jobs api: %w", err)
	}
	m, err := newAPIMetrics(cfg.Registerer)
	if err != nil {
		return nil, fmt.Errorf("new jobs api: %w", err)
	}
	return &API{
		cfg:     cfg,
		log:     cfg.Logger.With().Str("component", "jobs-api").Logger(),
		m:       m,
		running: map[string]bool{},
		kick:    make(chan struct{}, 1),
	}, nil
}

// endpoints is the jobs API. Each description is what GET /v1/ says
// about the route.
var endpoints = []serve.Endpoint[*API]{
	{Route: serve.Route{Method: http.MethodGet, Path: "/v1/analytics/retries", Role: serve.RoleViewer,
		Description: "Retry analytics per kind and per job type (?kind=&job_type=&days=&since=&until=&top=)."}, Serve: (*API).handleAnalytics},
	{Route: serve.Route{Method: http.MethodPost, Path: "/v1/jobs", Role: serve.RoleProducer,
		Description: `Enqueue a job ({"job_type", "payload", "run_at", "unique_for", ...}; header Idempotency-Key names it).`}, Serve: (*API).handleEnqueue},
	{Route: serve.Route{Method: http.MethodGet, Path: "/v1/jobs", Role: serve.RoleViewer,
		Description: "List jobs (?status=&job_type=&priority=&min_retry_count=&error_class=&since=&until=&limit=&cursor=)."}, Serve: (*API).handleList},
	{Route: serve.Route{Method: http.MethodPost, Path: "/v1/jobs/bulk-retry", Role: serve.RoleOperator,
		Description: "Retry the jobs a filter selects, at a limited rate; answers with an operation."}, Serve: (*API).handleBulkRetry},
	{Route: serve.Route{Method: http.MethodGet, Path: "/v1/jobs/{id}", Role: serve.RoleViewer,
		Description: "One job and its retry history."}, Serve: (*API).handleGet},
	{Route: serve.Route{Method: http.MethodPost, Path: "/v1/jobs/{id}/retry", Role: serve.RoleOperator,
		Description: `Retry a job now ({"reason", "reset_attempts", "error_class"}; the token's name is recorded as by).`}, Serve: (*API).handleRetry},
	{Route: serve.Route{Method: http.MethodPost, Path: "/v1/jobs/{id}/cancel", Role: serve.RoleOperator,
		Description: `Cancel a job's pending retry ({"reason"}; the token's name is recorded as by).`}, Serve: (*API).handleCancel},
	{Route: serve.Route{Method: http.MethodGet, Path: "/v1/schedules", Role: serve.RoleViewer,
		Description: "List periodic job schedules."}, Serve: (*API).handleListSchedules},
	{Route: serve.Route{Method: http.MethodGet, Path: "/v1/schedules/{job_type}/{name}", Role: serve.RoleViewer,
		Description: "One periodic job schedule."}, Serve: (*API).handleGetSchedule},
	{Route: serve.Route{Method: http.MethodPut, Path: "/v1/schedules/{job_type}/{name}", Role: serve.RoleAdmin,
		Description: `Create or replace a periodic job schedule ({"every"} or {"cron", "time_zone"}, and the job's fields).`}, Serve: (*API).handlePutSchedule},
	{Route: serve.Route{Method: http.MethodDelete, Path: "/v1/schedules/{job_type}/{name}", Role: serve.RoleAdmin,
		Description: "Delete a periodic job schedule."}, Serve: (*API).handleDeleteSchedule},
	{Route: serve.Route{Method: http.MethodGet, Path: "/v1/operations", Role: serve.RoleViewer,
		Description: "List bulk operations, newest first (?status=running|completed|cancelled&limit=&cursor=)."}, Serve: (*API).handleListOperations},
	{Route: serve.Route{Method: http.MethodGet, Path: "/v1/operations/{id}", Role: serve.RoleViewer,
		Description: "A bulk retry's progress."}, Serve: (*API).handleGetOperation},
	{Route: serve.Route{Method: http.MethodPost, Path: "/v1/operations/{id}/cancel", Role: serve.RoleOperator,
		Description: "Stop a bulk retry."}, Serve: (*API).handleCancelOperation},
}

// Routes lists the jobs API, for the index at GET /v1/.
func Routes() []serve.Route { return serve.Routes(endpoints) }

// Register adds the API's routes (Routes lists them) to mux.
func (a *API) Register(mux *http.ServeMux) {
	serve.Mount(mux, a, endpoints)
}

// Handler returns a handler serving only the API's routes. Put a
// serve.Guard in front: each route answers only a principal with the role
// it names.
func (a *API) Handler() http.Handler {
	mux := http.NewServeMux()
	a.Register(mux)
	return mux
}

func invalid(field, reason string) error {
	return &contract.FieldError{Field: field, Reason: reason, Err: contract.ErrInvalid}
}

// Aliases: the names of the puppet retry API (docs/jobs.md), accepted so
// that its clients work unchanged.
const (
	aliasJobType           = "jobType"
	aliasErrorType         = "errorType"
	aliasPermanentlyFailed = "permanently_failed"
)

// permanentlyFailed is what the alias status permanently_failed means: the
// jobs retryd gave up on, a non-retryable error or a spent budget.
// Cancelled jobs are not included: an operator stopped them.
var permanentlyFailed = []jobstore.Status{jobstore.StatusFailed, jobstore.StatusFailedMaxRetries}

// aliased returns the value of canonical or of its alias; a request giving
// both with different values is refused, as either could be the one meant.
func aliased(canonical, canonicalValue, alias, aliasValue string) (string, error) {
	if canonicalValue != "" && aliasValue != "" && canonicalValue != aliasValue {
		return "", invalid(canonical, fmt.Sprintf("differs from its alias %s (%q vs %q): give one of them", alias, canonicalValue, aliasValue))
	}
	if canonicalValue != "" {
		return canonicalValue, nil
	}
	return aliasValue, nil
}

// queryJobType reads job_type or its alias jobType.
func queryJobType(q url.Values) (string, error) {
	jt, err := aliased("job_type", q.Get("job_type"), aliasJobType, q.Get(aliasJobType))
	if err != nil || jt == "" {
		return jt, err
	}
	if err := contract.ValidateToken("job_type", jt); err != nil {
		return "", err
	}
	return jt, nil
}

// parseStatus reads one status of field, expanding permanently_failed.
func parseStatus(field, s string) ([]jobstore.Status, error) {
	if s == aliasPermanentlyFailed {
		return permanentlyFailed, nil
	}
	st := jobstore.Status(s)
	if !st.Valid() {
		return nil, invalid(field, fmt.Sprintf("%q is not one of %v or %s", st, jobstore.Statuses, aliasPermanentlyFailed))
	}
	return []jobstore.Status{st}, nil
}

// period reads since/until or days (default DefaultAnalyticsDays back from
// now).
func (a *API) period(q url.Values) (since, until time.Time, err error) {
	until = a.cfg.Now().UTC()
	if v := q.Get("until"); v != "" {
		if until, err = time.Parse(time.RFC3339Nano, v); err != nil {
			return since, until, invalid("until", "must be an RFC 3339 time")
		}
	}
	days := DefaultAnalyticsDays
	if v := q.Get("days"); v != "" {
		if q.Get("since") != "" {
			return since, until, invalid("days", "cannot be combined with since")
		}
		if days, err = strconv.Atoi(v); err != nil || days < 1 || days > 3660 {
			return since, until, invalid("days", "must be a whole number of days between 1 and 3660")
		}
	}
	since = until.AddDate(0, 0, -days)
	if v := q.Get("since"); v != "" {
		if since, err = time.Parse(time.RFC3339Nano, v); err != nil {
			return since, until, invalid("since", "must be an RFC 3339 time")
		}
	}
	if !until.After(since) {
		return since, until, invalid("until", "must be after since")
	}
	return since, until, nil
}

func (a *API) handleAnalytics(w http.ResponseWriter, r *http.Request) {
	q := r.URL.Query()
	since, until, err := a.period(q)
	if err != nil {
		serve.WriteError(w, err)
		return
	}
	aq := jobstore.AnalyticsQuery{Since: since, Until: until, Kind: q.Get("kind")}
	if aq.JobType, err = queryJobType(q); err != nil {
		serve.WriteError(w, err)
		return
	}
	if aq.Kind != "" {
		if err := contract.ValidateKind("kind", aq.Kind); err != nil {
			serve.WriteError(w, err)
			return
		}
	}
	if v := q.Get("top"); v != "" {
		if aq.TopErrors, err = strconv.Atoi(v); err != nil || aq.TopErrors < 1 || aq.TopErrors > 100 {
			serve.WriteError(w, invalid("top", "must be between 1 and 100"))
			return
		}
	}
	res, err := jobstore.RetryAnalytics(r.Context(), a.cfg.Pool, aq)
	if err != nil {
		a.writeErr(w, r, err)
		return
	}
	serve.WriteJSON(w, http.StatusOK, res)
}

// listFilter reads the filter of GET /v1/jobs.
func listFilter(q url.Values) (jobstore.Filter, error) {
	var f jobstore.Filter
	for _, v := range q["status"] {
		for _, s := range strings.Split(v, ",") {
			sts, err := parseStatus("status", strings.TrimSpace(s))
			if err != nil {
				return f, err
			}
			f.Statuses = append(f.Statuses, sts...)
		}
	}
	var err error
	if f.JobType, err = queryJobType(q); err != nil {
		return f, err
	}
	if v := q.Get("priority"); v != "" {
		if err := contract.ValidatePriority("priority", contract.Priority(v)); err != nil {
			return f, err
		}
		f.Priority = v
	}
	if v := q.Get("min_retry_count"); v != "" {
		n, err := strconv.Atoi(v)
		if err != nil || n < 0 || n > contract.MaxAttempt {
			return f, invalid("min_retry_count", "must be a non-negative whole number")
		}
		f.MinRetryCount = n
	}
	f.ErrorClass = q.Get("error_class")
	if f.ErrorClass != "" {
		if err := contract.ValidateToken("error_class", f.ErrorClass); err != nil {
			return f, err
		}
	}
	for _, p := range []struct {
		name string
		dst  **time.Time
	}{{"since", &f.Since}, {"until", &f.Until}} {
		if v := q.Get(p.name); v != "" {
			t, err := time.Parse(time.RFC3339Nano, v)
			if err != nil {
				return f, invalid(p.name, "must be an RFC 3339 time")
			}
			*p.dst = &t
		}
	}
	return f, nil
}

func (a *API) handleList(w http.ResponseWriter, r *http.Request) {
	q := r.URL.Query()
	f, err := listFilter(q)
	if err != nil {
		serve.WriteError(w, err)
		return
	}
	a.writePage(w, r, q, func(limit int, cursor string) (any, error) {
		return jobstore.List(r.Context(), a.cfg.Pool, f, limit, cursor)
	})
}

// writePage answers a list route with the page read reads at ?limit=
// (0 when absent) and ?cursor=, or with the error: a bad limit or cursor
// is a 400 naming the parameter.
func (a *API) writePage(w http.ResponseWriter, r *http.Request, q url.Values, read func(limit int, cursor string) (any, error)) {
	limit := 0
	if v := q.Get("limit"); v != "" {
		var err error
		limit, err = strconv.Atoi(v)
		if err != nil || limit < 1 || limit > jobstore.MaxListLimit {
			serve.WriteError(w, invalid("limit", fmt.Sprintf("must be between 1 and %d", jobstore.MaxListLimit)))
			return
		}
	}
	page, err := read(limit, q.Get("cursor"))
	switch {
	case errors.Is(err, pgdb.ErrBadCursor):
		serve.WriteError(w, invalid("cursor", "is not a cursor this API returned"))
	case err != nil:
		a.writeErr(w, r, err)
	default:
		serve.WriteJSON(w, http.StatusOK, page)
	}
}

// JobDetail is GET /v1/jobs/{id}: the job and every lifecycle fact of it.
type JobDetail struct {
	Job     *jobstore.Job             `json:"job"`
	History []retrystore.HistoryEntry `json:"history"`
}

func pathID(r *http.Request) (string, error) {
	id := r.PathValue("id")
	if err := contract.ValidateID("id", id); err != nil {
		return "", err
	}
	return id, nil
}

func (a *API) handleGet(w http.ResponseWriter, r *http.Request) {
	id, err := pathID(r)
	if err != nil {
		serve.WriteError(w, err)
		return
	}
	var detail JobDetail
	job, err := jobstore.Get(r.Context(), a.cfg.Pool, id)
	switch {
	case err == nil:
		detail.Job = &job
	case !errors.Is(err, pgdb.ErrNotFound):
		a.writeErr(w, r, err)
		return
	}
	detail.History, err = retrystore.History(r.Context(), a.cfg.Pool, contract.KindJob, id)
	if err != nil {
		a.writeErr(w, r, err)
		return
	}
	if detail.Job == nil && len(detail.History) == 0 {
		serve.WriteError(w, fmt.Errorf("job %s: %w", id, pgdb.ErrNotFound))
		return
	}
	if detail.History == nil {
		detail.History = []retrystore.HistoryEntry{}
	}
	serve.WriteJSON(w, http.StatusOK, detail)
}

// ActionRequest is the body of POST /v1/jobs/{id}/retry and /cancel. All
// fields are optional; an empty body is fine.
type ActionRequest struct {
	Reason        string `json:"reason,omitempty"`
	By            string `json:"by,omitempty"`
	ResetAttempts bool   `json:"reset_attempts,omitempty"`
	// ErrorClass (retry only) is an error class (pkg/errclass) the
	// operator files the retry under; it is recorded in the retry's
	// history entry and audit detail. ErrorType is its alias, the puppet
	// API's errorType.
	ErrorClass string `json:"error_class,omitempty"`
	ErrorType  string `json:"errorType,omitempty"`
}

// errorClass reads error_class or its alias errorType as an error class.
func (req ActionRequest) errorClass() (string, error) {
	parse := func(field, v string) (string, error) {
		if v == "" {
			return "", nil
		}
		c, err := errclass.Parse(v)
		if err != nil {
			return "", invalid(field, err.Error())
		}
		return string(c), nil
	}
	canonical, err := parse("error_class", req.ErrorClass)
	if err != nil {
		return "", err
	}
	alias, err := parse(aliasErrorType, req.ErrorType)
	if err != nil {
		return "", err
	}
	// Compared as classes, so temporary and temporary_error agree.
	return aliased("error_class", canonical, aliasErrorType, alias)
}

// ActionResponse answers an accepted action: the scheduler recorded it and
// the job's status follows as the projection folds the resulting event.
type ActionResponse struct {
	ID         string `json:"id"`
	Action     string `json:"action"`
	By         string `json:"by"`
	Reason     string `json:"reason,omitempty"`
	ErrorClass string `json:"error_class,omitempty"`
}

func (a *API) action(w http.ResponseWriter, r *http.Request, name string) {
	id, err := pathID(r)
	if err != nil {
		serve.WriteError(w, err)
		return
	}
	var req ActionRequest
	if err := serve.DecodeOptionalJSON(r, a.cfg.MaxBodyBytes, &req); err != nil {
		serve.WriteError(w, err)
		return
	}
	// A "by" in the body is ignored: the record names the token's
	// principal.
	req.By = serve.Actor(r)
	if err := pgtext.CheckActor(req.By, req.Reason, contract.MaxMessageLen); err != nil {
		serve.WriteError(w, err)
		return
	}
	class, err := req.errorClass()
	if err != nil {
		serve.WriteError(w, err)
		return
	}
	// The scheduler's retry action records the audit entry in its
	// transaction; it is named as a job action here.
	if name == "retry" {
		ctx := audit.Named(r.Context(), audit.JobRetry)
		err = a.cfg.Retry.RetryNow(ctx, contract.KindJob, id, req.Reason, req.By, req.ResetAttempts, class)
	} else {
		if req.ResetAttempts {
			serve.WriteError(w, invalid("reset_attempts", "applies to retry only"))
			return
		}
		if class != "" {
			field := "error_class"
			if req.ErrorClass == "" {
				field = aliasErrorType
			}
			serve.WriteError(w, invalid(field, "applies to retry only"))
			return
		}
		ctx := audit.Named(r.Context(), audit.JobCancel)
		err = a.cfg.Retry.Cancel(ctx, contract.KindJob, id, req.By, req.Reason)
	}
	if err != nil {
		a.writeErr(w, r, err)
		return
	}
	a.log.Info().Str("job_id", id).Str("action", name).Str("by", req.By).Msg("job action")
	serve.WriteJSON(w, http.StatusAccepted, ActionResponse{ID: id, Action: name, By: req.By, Reason: req.Reason, ErrorClass: class})
}

func (a *API) handleRetry(w http.ResponseWriter, r *http.Request)  { a.action(w, r, "retry") }
func (a *API) handleCancel(w http.ResponseWriter, r *http.Request) { a.action(w, r, "cancel") }

// writeErr answers err; the API's own failures (5xx) are logged, the
// client's (a scheduler's 400, 404 or 409 among them) are not.
func (a *API) writeErr(w http.ResponseWriter, r *http.Request, err error) {
	serve.WriteErrorLog(w, r, a.log, err)
}
