package scheduler

import (
	"fmt"
	"net/http"
	"net/url"
	"strconv"

	"github.com/retryd/retryd/internal/serve"
	"github.com/retryd/retryd/pkg/contract"
	"github.com/retryd/retryd/stores/retrystore"
)

// maxBodyBytes caps request bodies of the API.
const maxBodyBytes = 64 << 10

// endpoints is the operator API. Each description is what GET /v1/ says
// about the route.
var endpoints = []serve.Endpoint[*Scheduler]{
	{Route: serve.Route{Method: http.MethodGet, Path: "/v1/retries", Role: serve.RoleViewer,
		Description: "List retries, a page at a time (?kind=&state=&source=&job_type=&limit=&cursor=)."}, Serve: (*Scheduler).handleList},
	{Route: serve.Route{Method: http.MethodGet, Path: "/v1/retries/{kind}/{id}", Role: serve.RoleViewer,
		Description: "One retry and its history: why it retried."}, Serve: (*Scheduler).handleGet},
	{Route: serve.Route{Method: http.MethodPost, Path: "/v1/retries/{kind}/{id}/cancel", Role: serve.RoleOperator,
		Description: `Cancel a pending retry ({"reason"}; the token's name is recorded as by).`}, Serve: (*Scheduler).handleCancel},
	{Route: serve.Route{Method: http.MethodPost, Path: "/v1/retries/{kind}/{id}/retry", Role: serve.RoleOperator,
		Description: `Retry now, from any state ({"reason", "reset_attempts"}; the token's name is recorded as by).`}, Serve: (*Scheduler).handleRetry},
	{Route: serve.Route{Method: http.MethodGet, Path: "/v1/policies", Role: serve.RoleViewer,
		Description: "List retry policies."}, Serve: (*Scheduler).handleListPolicies},
	{Route: serve.Route{Method: http.MethodGet, Path: "/v1/policies/template", Role: serve.RoleViewer,
		Description: "Where a new policy starts (?kind=&job_type=): the fallback policy's values, unnamed."}, Serve: (*Scheduler).handlePolicyTemplate},
	{Route: serve.Route{Method: http.MethodGet, Path: "/v1/policies/{kind}/{job_type}", Role: serve.RoleViewer,
		Description: `One retry policy ("_" or "default" as job_type: the kind's default).`}, Serve: (*Scheduler).handleGetPolicy},
	{Route: serve.Route{Method: http.MethodPut, Path: "/v1/policies/{kind}/{job_type}", Role: serve.RoleAdmin,
		Description: "Create or change a retry policy; each change is a new version."}, Serve: (*Scheduler).handlePutPolicy},
	{Route: serve.Route{Method: http.MethodGet, Path: "/v1/policies/{kind}/{job_type}/versions", Role: serve.RoleViewer,
		Description: "Every version of a retry policy."}, Serve: (*Scheduler).handlePolicyVersions},
}

// Routes lists the operator API, for the index at GET /v1/.
func Routes() []serve.Route { return serve.Routes(endpoints) }

// Handler returns the operator API (Routes lists it); mount it next to
// internal/serve's health and metrics endpoints, behind a serve.Guard:
// each route answers only a principal with the role it names.
func (s *Scheduler) Handler() http.Handler {
	mux := http.NewServeMux()
	serve.Mount(mux, s, endpoints)
	return mux
}

func invalidField(field, reason string) error {
	return &contract.FieldError{Field: field, Reason: reason, Err: contract.ErrInvalid}
}

// listQuery parses the list filter strictly: unknown parameters are
// rejected rather than silently ignored.
func listQuery(q url.Values) (retrystore.ListFilter, error) {
	var f retrystore.ListFilter
	for key, vals := range q {
		if len(vals) != 1 {
			return f, invalidField(key, "must be given once")
		}
		v := vals[0]
		if v == "" {
			continue
		}
		var err error
		switch key {
		case "kind":
			f.Kind, err = v, contract.ValidateKind("kind", v)
		case "state":
			f.State = retrystore.State(v)
			if !f.State.Valid() {
				err = invalidField("state", fmt.Sprintf("%q is not one of %v", v, retrystore.States))
			}
		case "source":
			f.Source, err = v, contract.ValidateToken("source", v)
		case "job_type":
			f.JobType, err = v, contract.ValidateToken("job_type", v)
		case "limit":
			f.Limit, err = strconv.Atoi(v)
			if err != nil || f.Limit < 1 || f.Limit > retrystore.MaxListLimit {
				err = invalidField("limit", fmt.Sprintf("must be an integer between 1 and %d", retrystore.MaxListLimit))
			}
		case "cursor":
			f.Cursor = v
		default:
			err = invalidField(key, "is not a known parameter (kind, state, source, job_type, limit, cursor)")
		}
		if err != nil {
			return f, err
		}
	}
	return f, nil
}

func (s *Scheduler) handleList(w http.ResponseWriter, r *http.Request) {
	f, err := listQuery(r.URL.Query())
	if err != nil {
		serve.WriteError(w, err)
		return
	}
	page, err := retrystore.List(r.Context(), s.cfg.Pool, f)
	serve.ReplyPage(w, page, err)
}

// RetryView is one retry with its history: everything that answers "why
// did it retry?". GET /v1/retries/{kind}/{id} answers it; a manual cancel
// or retry answers it without the history.
type RetryView struct {
	Retry   retrystore.Retry          `json:"retry"`
	History []retrystore.HistoryEntry `json:"history,omitempty"`
}

func pathItem(r *http.Request) (kind, id string, err error) {
	kind, id = r.PathValue("kind"), r.PathValue("id")
	if err := contract.ValidateKind("kind", kind); err != nil {
		return "", "", err
	}
	if err := contract.ValidateID("id", id); err != nil {
		return "", "", err
	}
	return kind, id, nil
}

func (s *Scheduler) handleGet(w http.ResponseWriter, r *http.Request) {
	kind, id, err := pathItem(r)
	if err != nil {
		serve.WriteError(w, err)
		return
	}
	row, err := retrystore.Get(r.Context(), s.cfg.Pool, kind, id)
	if isNotFound(err) {
		err = fmt.Errorf("%s/%s: %w", kind, id, ErrNotFound)
	}
	if err != nil {
		serve.WriteError(w, err)
		return
	}
	hist, err := retrystore.History(r.Context(), s.cfg.Pool, kind, id)
	serve.Reply(w, RetryView{Retry: row, History: hist}, err)
}

// cancelRequest and retryRequest keep "by" so older clients that send it
// are not refused, but it is ignored: the record names the token's
// principal (serve.Actor).
type cancelRequest struct {
	Reason string `json:"reason"`
	By     string `json:"by"`
}

func (s *Scheduler) handleCancel(w http.ResponseWriter, r *http.Request) {
	itemAction(w, r, func(kind, id string, req cancelRequest) (retrystore.Retry, error) {
		return s.Cancel(r.Context(), kind, id, serve.Actor(r), req.Reason)
	})
}

type retryRequest struct {
	Reason        string `json:"reason"`
	By            string `json:"by"`
	ResetAttempts bool   `json:"reset_attempts"`
}

func (s *Scheduler) handleRetry(w http.ResponseWriter, r *http.Request) {
	itemAction(w, r, func(kind, id string, req retryRequest) (retrystore.Retry, error) {
		return s.RetryNow(r.Context(), kind, id, RetryNowOptions{Reason: req.Reason, By: serve.Actor(r), ResetAttempts: req.ResetAttempts})
	})
}

// itemAction serves a manual action on the item the path names: it
// decodes the optional body into a Req and answers with the row act
// leaves.
func itemAction[Req any](w http.ResponseWriter, r *http.Request, act func(kind, id string, req Req) (retrystore.Retry, error)) {
	kind, id, err := pathItem(r)
	if err != nil {
		serve.WriteError(w, err)
		return
	}
	var req Req
	if err := serve.DecodeOptionalJSON(r, maxBodyBytes, &req); err != nil {
		serve.WriteError(w, err)
		return
	}
	row, err := act(kind, id, req)
	serve.Reply(w, RetryView{Retry: row}, err)
}
