package auth

import (
	"fmt"
	"net/http"
	"net/url"
	"strconv"
	"time"

	"github.com/retryd/retryd/internal/audit"
	"github.com/retryd/retryd/internal/serve"
	"github.com/retryd/retryd/pkg/contract"
	"github.com/retryd/retryd/stores/pgdb"
)

// maxBody caps a token request's body.
const maxBody = 4 << 10

// API serves token management and the audit trail. It is mounted by the
// binary that owns the operator API (the scheduler, and retryd dev);
// tokens and the audit trail are shared by all services through Postgres.
type API struct {
	store *Store
}

// NewAPI returns the token routes over store.
func NewAPI(store *Store) *API { return &API{store: store} }

// endpoints are the token routes: admin only, since a token of any role
// can be minted here.
var endpoints = []serve.Endpoint[*API]{
	{Route: serve.Route{Method: http.MethodPost, Path: "/v1/tokens", Role: serve.RoleAdmin,
		Description: `Create an API token ({"name", "role", "expires_at"}); the answer holds the token, shown this once. Refused (403) with authentication off.`}, Serve: (*API).create},
	{Route: serve.Route{Method: http.MethodGet, Path: "/v1/tokens", Role: serve.RoleAdmin,
		Description: "List API tokens (never their secrets), revoked ones too."}, Serve: (*API).list},
	{Route: serve.Route{Method: http.MethodDelete, Path: "/v1/tokens/{id}", Role: serve.RoleAdmin,
		Description: "Revoke an API token; services refuse it within seconds."}, Serve: (*API).revoke},
	{Route: serve.Route{Method: http.MethodGet, Path: "/v1/audit", Role: serve.RoleAdmin,
		Description: "The audit trail: who did which operator or admin action, newest first (?principal=&action=&since=&limit=&cursor=)."}, Serve: (*API).audit},
}

// Routes lists the token routes, for the index at GET /v1/.
func Routes() []serve.Route { return serve.Routes(endpoints) }

// Register adds the token routes to mux.
func (a *API) Register(mux *http.ServeMux) { serve.Mount(mux, a, endpoints) }

// CreateRequest is the body of POST /v1/tokens.
type CreateRequest struct {
	Name      string     `json:"name"`
	Role      string     `json:"role"`
	ExpiresAt *time.Time `json:"expires_at,omitempty"`
}

// Created is the answer to POST /v1/tokens: the record and the token.
type Created struct {
	Token
	Secret string `json:"token"`
}

// errCreateAuthOff is the message of POST /v1/tokens with authentication
// off.
var errCreateAuthOff = fmt.Sprintf("tokens can only be created with %s=tokens: with authentication off every caller "+
	"is admin, so a token made now would let whoever made it in once tokens are on. Start with %s=tokens "+
	"(retryd dev then prints an admin token, or takes %s) and create tokens with that admin token",
	EnvMode, EnvMode, EnvAdminToken)

func (a *API) create(w http.ResponseWriter, r *http.Request) {
	// Refused rather than marked: a dev data dir then holds no token its
	// owner did not make with tokens on, whoever reached the API while
	// it was off.
	if serve.AuthOff(r.Context()) {
		serve.WriteJSON(w, http.StatusForbidden, serve.ErrorBody{Error: serve.ErrorDetail{Code: serve.CodeForbidden, Message: errCreateAuthOff}})
		return
	}
	var req CreateRequest
	if err := serve.DecodeJSON(r, maxBody, &req); err != nil {
		serve.WriteError(w, err)
		return
	}
	role, err := serve.ParseRole(req.Role)
	if err != nil || role == serve.RolePublic {
		serve.WriteError(w, &contract.FieldError{Field: "role", Reason: "must be producer, viewer, operator or admin", Err: contract.ErrInvalid})
		return
	}
	t, secret, err := a.store.Create(r.Context(), req.Name, role, req.ExpiresAt)
	if err != nil {
		serve.WriteError(w, err)
		return
	}
	w.Header().Set("Cache-Control", "no-store")
	serve.WriteJSON(w, http.StatusCreated, Created{Token: t, Secret: secret})
}

func (a *API) list(w http.ResponseWriter, r *http.Request) {
	if len(r.URL.Query()) > 0 {
		serve.WriteError(w, &contract.FieldError{Field: "query", Reason: "takes no parameters", Err: contract.ErrInvalid})
		return
	}
	ts, err := a.store.List(r.Context())
	if err != nil {
		serve.WriteError(w, err)
		return
	}
	if ts == nil {
		ts = []Token{}
	}
	serve.WriteJSON(w, http.StatusOK, TokenList{Tokens: ts})
}

// TokenList is GET /v1/tokens.
type TokenList struct {
	Tokens []Token `json:"tokens"`
}

func (a *API) revoke(w http.ResponseWriter, r *http.Request) {
	id := r.PathValue("id")
	if err := contract.ValidateID("id", id); err != nil {
		serve.WriteError(w, fmt.Errorf("token %q: %w", id, pgdb.ErrNotFound))
		return
	}
	t, err := a.store.Revoke(r.Context(), id)
	serve.Reply(w, t, err)
}

func (a *API) audit(w http.ResponseWriter, r *http.Request) {
	f, err := auditQuery(r.URL.Query())
	if err != nil {
		serve.WriteError(w, err)
		return
	}
	page, err := audit.List(r.Context(), a.store.pool, f)
	serve.ReplyPage(w, page, err)
}

// auditQuery parses the audit filter strictly: unknown parameters are
// refused rather than silently ignored, as on the other list routes.
func auditQuery(q url.Values) (audit.Filter, error) {
	var f audit.Filter
	bad := func(field, reason string) error {
		return &contract.FieldError{Field: field, Reason: reason, Err: contract.ErrInvalid}
	}
	for key, vals := range q {
		if len(vals) != 1 {
			return f, bad(key, "must be given once")
		}
		v := vals[0]
		if v == "" {
			continue
		}
		switch key {
		case "principal":
			if len(v) > maxNameLen {
				return f, bad(key, fmt.Sprintf("is longer than %d characters", maxNameLen))
			}
			f.Principal = v
		case "action":
			if len(v) > 100 {
				return f, bad(key, "is longer than 100 characters")
			}
			f.Action = v
		case "since":
			t, err := time.Parse(time.RFC3339, v)
			if err != nil {
				return f, bad(key, "must be an RFC 3339 time, such as 2026-01-02T15:04:05Z")
			}
			f.Since = t
		case "limit":
			n, err := strconv.Atoi(v)
			if err != nil || n < 1 || n > audit.MaxLimit {
				return f, bad(key, fmt.Sprintf("must be between 1 and %d", audit.MaxLimit))
			}
			f.Limit = n
		case "cursor":
			f.Cursor = v
		default:
			return f, bad(key, "is not a known parameter (principal, action, since, limit, cursor)")
		}
	}
	return f, nil
}
