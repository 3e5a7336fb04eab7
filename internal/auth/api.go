package auth

import (
	"fmt"
	"net/http"
	"time"

	"github.com/retryd/retryd/internal/serve"
	"github.com/retryd/retryd/pkg/contract"
)

// maxBody caps a token request's body.
const maxBody = 4 << 10

// API serves token management. It is mounted by the binary that owns the
// operator API (the scheduler, and retryd dev); tokens are shared by all
// services through Postgres.
type API struct {
	store *Store
}

// NewAPI returns the token routes over store.
func NewAPI(store *Store) *API { return &API{store: store} }

// endpoints are the token routes: admin only, since a token of any role
// can be minted here.
var endpoints = []serve.Endpoint[*API]{
	{Route: serve.Route{Method: http.MethodPost, Path: "/v1/tokens", Role: serve.RoleAdmin,
		Description: `Create an API token ({"name", "role", "expires_at"}); the answer holds the token, shown this once.`}, Serve: (*API).create},
	{Route: serve.Route{Method: http.MethodGet, Path: "/v1/tokens", Role: serve.RoleAdmin,
		Description: "List API tokens (never their secrets), revoked ones too."}, Serve: (*API).list},
	{Route: serve.Route{Method: http.MethodDelete, Path: "/v1/tokens/{id}", Role: serve.RoleAdmin,
		Description: "Revoke an API token; services refuse it within seconds."}, Serve: (*API).revoke},
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

func (a *API) create(w http.ResponseWriter, r *http.Request) {
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
	serve.WriteJSON(w, http.StatusOK, map[string]any{"tokens": ts})
}

func (a *API) revoke(w http.ResponseWriter, r *http.Request) {
	id := r.PathValue("id")
	if err := contract.ValidateID("id", id); err != nil {
		serve.WriteError(w, fmt.Errorf("token %q: %w", id, serve.ErrNotFound))
		return
	}
	t, err := a.store.Revoke(r.Context(), id)
	if err != nil {
		serve.WriteError(w, err)
		return
	}
	serve.WriteJSON(w, http.StatusOK, t)
}
