package triggers

import (
	"encoding/json"
	"errors"
	"fmt"
	"net/http"
	"net/url"
	"slices"
	"strings"
	"time"

	"github.com/retryd/retryd/internal/serve"
	"github.com/retryd/retryd/pkg/contract"
	"github.com/retryd/retryd/services/triggers/internal/triggerstore"
	"github.com/retryd/retryd/stores/pgdb"
)

// The operator views of workflow runs (docs/operations.md, "Runs"). They
// only read workflow_runs and workflow_run_steps. A manual retry of a run
// is the scheduler's, like any item's: POST /v1/retries/run/{run_id}/retry
// (the triggers service has no handle on the scheduler, and a retry must be
// the scheduler's rescheduled decision to be counted, audited and brought
// back through retry.run.due like an automatic one).
var runEndpoints = []serve.Endpoint[*Service]{
	{Route: serve.Route{Method: http.MethodGet, Path: "/v1/runs", Role: serve.RoleViewer,
		Description: "List workflow runs, newest first (?workflow=&trigger_id=&status=&error_class=&limit=&cursor=)."}, Serve: (*Service).listRuns},
	{Route: serve.Route{Method: http.MethodGet, Path: "/v1/runs/{id}", Role: serve.RoleViewer,
		Description: "One workflow run and its steps (retry it now with POST /v1/retries/run/{id}/retry)."}, Serve: (*Service).getRun},
}

// allEndpoints is the trigger API with the run views.
func allEndpoints() []serve.Endpoint[*Service] { return slices.Concat(endpoints, runEndpoints) }

// runViewStatuses are the statuses of a workflow run (migration 00304).
var runViewStatuses = []string{"requested", "in_progress", "retrying", "completed", "failed", "failed_max_retries"}

// runPermanentlyFailed is the alias status of GET /v1/runs, as the jobs
// API has it: the runs retryd gave up on, a non-retryable error or a spent
// budget.
const runPermanentlyFailed = "permanently_failed"

// runListParams are the parameters GET /v1/runs knows; any other is
// refused, so a misspelt filter does not silently list every run.
var runListParams = []string{"workflow", "trigger_id", "status", "error_class", "limit", "cursor"}

// RunView is how the API shows a workflow run: every column of
// workflow_runs.
type RunView struct {
	ID                 string     `json:"id"`
	Workflow           string     `json:"workflow"`
	Status             string     `json:"status"`
	TriggerID          string     `json:"trigger_id,omitempty"`
	DeliveryID         string     `json:"delivery_id,omitempty"`
	EventID            string     `json:"event_id,omitempty"`
	Attempt            int        `json:"attempt"`
	RetryCount         int        `json:"retry_count"`
	MaxRetries         *int       `json:"max_retries"`
	RetryEnabled       bool       `json:"retry_enabled"`
	CurrentNodeID      string     `json:"current_node_id,omitempty"`
	Error              string     `json:"error,omitempty"`
	LastErrorClass     string     `json:"last_error_class,omitempty"`
	LastErrorMessage   string     `json:"last_error_message,omitempty"`
	LastErrorTimestamp *time.Time `json:"last_error_timestamp,omitempty"`
	NextRetryAt        *time.Time `json:"next_retry_at,omitempty"`
	Executor           string     `json:"executor,omitempty"`
	LeaseExpiresAt     *time.Time `json:"lease_expires_at,omitempty"`
	RequestedAt        time.Time  `json:"requested_at"`
	UpdatedAt          time.Time  `json:"updated_at"`
	FinishedAt         *time.Time `json:"finished_at,omitempty"`
}

func viewRun(r triggerstore.Run) RunView {
	return RunView{
		ID: r.ID, Workflow: r.Workflow, Status: string(r.Status), TriggerID: r.TriggerID, DeliveryID: r.DeliveryID,
		EventID: r.EventID, Attempt: r.Attempt, RetryCount: r.RetryCount, MaxRetries: r.MaxRetries,
		RetryEnabled: r.RetryEnabled, CurrentNodeID: r.CurrentNodeID, Error: r.Error,
		LastErrorClass: r.LastErrorClass, LastErrorMessage: r.LastErrorMessage,
		LastErrorTimestamp: r.LastErrorTimestamp, NextRetryAt: r.NextRetryAt, Executor: r.Executor,
		LeaseExpiresAt: r.LeaseExpiresAt, RequestedAt: r.RequestedAt, UpdatedAt: r.UpdatedAt, FinishedAt: r.FinishedAt,
	}
}

// StepView is how the API shows a step (a node) of a run.
type StepView struct {
	Node string `json:"node"`
	// Status is the node's last report: completed or failed.
	Status string `json:"status"`
	// Attempts is how many attempts of the run ran the node; RunAttempt
	// the run attempt of its last report.
	Attempts   int `json:"attempts"`
	RunAttempt int `json:"run_attempt"`
	// RetryState: none, scheduled (the run comes back at NextAttemptAt
	// and starts at this node), exhausted or succeeded (completed after
	// failing).
	RetryState       string          `json:"retry_state"`
	NextAttemptAt    *time.Time      `json:"next_attempt_at,omitempty"`
	RetryAttempts    int             `json:"retry_attempts"`
	LastErrorClass   string          `json:"last_error_class,omitempty"`
	LastErrorMessage string          `json:"last_error_message,omitempty"`
	Executor         string          `json:"executor,omitempty"`
	Output           json.RawMessage `json:"output,omitempty"`
	// ReportedAt is when the executor first reported the node: it orders
	// a run's steps.
	ReportedAt time.Time `json:"reported_at"`
	CreatedAt  time.Time `json:"created_at"`
	UpdatedAt  time.Time `json:"updated_at"`
}

func viewStep(s triggerstore.Step) StepView {
	return StepView{
		Node: s.Node, Status: s.Status, Attempts: s.Attempts, RunAttempt: s.RunAttempt,
		RetryState: s.RetryState, NextAttemptAt: s.NextAttemptAt, RetryAttempts: s.RetryAttempts,
		LastErrorClass: s.LastErrorClass, LastErrorMessage: s.LastErrorMessage,
		Executor: s.Executor, Output: s.Output, ReportedAt: s.ReportedAt, CreatedAt: s.CreatedAt, UpdatedAt: s.UpdatedAt,
	}
}

// RunPage is GET /v1/runs.
type RunPage struct {
	Runs []RunView `json:"runs"`
	// NextCursor is empty on the last page.
	NextCursor string `json:"next_cursor,omitempty"`
}

// RunDetail is GET /v1/runs/{id}: the run and its steps in the order they
// were first reported (reported_at).
type RunDetail struct {
	Run   RunView    `json:"run"`
	Steps []StepView `json:"steps"`
}

// runStatuses reads one status of the status filter, expanding
// permanently_failed.
func runStatuses(s string) ([]string, error) {
	if s == runPermanentlyFailed {
		return []string{"failed", "failed_max_retries"}, nil
	}
	if !slices.Contains(runViewStatuses, s) {
		return nil, invalidField("status", fmt.Sprintf("%q is not one of %s or %s", s, strings.Join(runViewStatuses, ", "), runPermanentlyFailed))
	}
	return []string{s}, nil
}

// runFilter reads the filter of GET /v1/runs strictly: an unknown
// parameter, a parameter given twice (but status, which may be repeated)
// or a bad value is refused naming it.
func runFilter(q url.Values) (triggerstore.RunFilter, error) {
	var f triggerstore.RunFilter
	for key, vals := range q {
		if !slices.Contains(runListParams, key) {
			return f, invalidField(key, "is not a known parameter ("+strings.Join(runListParams, ", ")+")")
		}
		if key != "status" && len(vals) != 1 {
			return f, invalidField(key, "must be given once")
		}
	}
	for _, v := range q["status"] {
		for _, s := range strings.Split(v, ",") {
			if s = strings.TrimSpace(s); s == "" {
				continue
			}
			sts, err := runStatuses(s)
			if err != nil {
				return f, err
			}
			for _, st := range sts {
				if !slices.Contains(f.Statuses, st) {
					f.Statuses = append(f.Statuses, st)
				}
			}
		}
	}
	f.Workflow, f.TriggerID, f.ErrorClass = q.Get("workflow"), q.Get("trigger_id"), q.Get("error_class")
	for _, p := range []struct {
		name, value string
		check       func(field, v string) error
	}{
		{"workflow", f.Workflow, contract.ValidateToken},
		{"trigger_id", f.TriggerID, contract.ValidateID},
		{"error_class", f.ErrorClass, contract.ValidateToken},
	} {
		if p.value == "" {
			continue
		}
		if err := p.check(p.name, p.value); err != nil {
			return f, err
		}
	}
	return f, nil
}

func (s *Service) listRuns(w http.ResponseWriter, r *http.Request) {
	q := r.URL.Query()
	f, err := runFilter(q)
	if err != nil {
		s.writeErr(w, r, err)
		return
	}
	limit, err := queryLimit(r)
	if err != nil {
		s.writeErr(w, r, err)
		return
	}
	page, err := triggerstore.ListRuns(r.Context(), s.cfg.Pool, f, limit, q.Get("cursor"))
	if errors.Is(err, pgdb.ErrBadCursor) {
		err = invalidField("cursor", "is not a cursor this API returned")
	}
	if err != nil {
		s.writeErr(w, r, err)
		return
	}
	serve.WriteJSON(w, http.StatusOK, RunPage{Runs: viewAll(page.Runs, viewRun), NextCursor: page.NextCursor})
}

func (s *Service) getRun(w http.ResponseWriter, r *http.Request) {
	id, err := pathID(r)
	if err != nil {
		s.writeErr(w, r, err)
		return
	}
	run, err := triggerstore.GetRun(r.Context(), s.cfg.Pool, id)
	if err != nil {
		s.writeErr(w, r, storeErr(err, "run "+id))
		return
	}
	steps, err := triggerstore.Steps(r.Context(), s.cfg.Pool, id)
	if err != nil {
		s.writeErr(w, r, err)
		return
	}
	serve.WriteJSON(w, http.StatusOK, RunDetail{Run: viewRun(run), Steps: viewAll(steps, viewStep)})
}
