package serve

import (
	"cmp"
	"net/http"
	"slices"
)

// Route is one route of an HTTP API, as the index at GET /v1/ lists it.
type Route struct {
	Method      string `json:"method"`
	Path        string `json:"path"`
	Description string `json:"description"`
	// Role is what a caller needs to use the route (see Role). Mount
	// panics when it is missing.
	Role Role `json:"role"`
}

// Endpoint is a Route and the method of T that serves it. A service that
// declares its API as one list of endpoints mounts and lists the same
// routes, so the index cannot drift from what is served.
type Endpoint[T any] struct {
	Route
	Serve func(T, http.ResponseWriter, *http.Request)
}

// Mount registers every endpoint on mux as "METHOD PATH", served by recv
// to callers whose role allows the endpoint's (Require). It panics on an
// endpoint without a role, when the mux is built, so no route can be
// served without a rule.
func Mount[T any](mux *http.ServeMux, recv T, endpoints []Endpoint[T]) {
	for _, e := range endpoints {
		if e.Role == roleUnset {
			panic("serve: " + e.Method + " " + e.Path + " has no role: every endpoint must name the role it needs")
		}
		serveFn := e.Serve
		mux.Handle(e.Method+" "+e.Path, Require(e.Role, http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
			serveFn(recv, w, r)
		})))
	}
}

// Routes returns the routes of endpoints, in their order.
func Routes[T any](endpoints []Endpoint[T]) []Route {
	out := make([]Route, len(endpoints))
	for i, e := range endpoints {
		out[i] = e.Route
	}
	return out
}

// IndexPath is the pattern of the API index; mount IndexHandler on it.
// {$} keeps it from matching every path under /v1/, which must stay 404.
const IndexPath = "GET /v1/{$}"

// Index is the body of GET /v1/.
type Index struct {
	Routes []Route `json:"routes"`
}

// IndexHandler answers GET /v1/ with every route of the given lists and
// its own, sorted by path and method, so a reader of the printed API
// address finds what it serves without the docs. It needs IndexRole.
func IndexHandler(lists ...[]Route) http.Handler {
	routes := []Route{{Method: http.MethodGet, Path: "/v1/", Description: "This index of the API's routes.", Role: IndexRole}}
	for _, l := range lists {
		routes = append(routes, l...)
	}
	slices.SortStableFunc(routes, func(a, b Route) int {
		return cmp.Or(cmp.Compare(a.Path, b.Path), cmp.Compare(a.Method, b.Method))
	})
	idx := Index{Routes: routes}
	return Require(IndexRole, http.HandlerFunc(func(w http.ResponseWriter, _ *http.Request) {
		WriteJSON(w, http.StatusOK, idx)
	}))
}

// IndexRole is what GET /v1/ needs: the index tells which routes exist and
// who may use them, which is for people who read the API.
const IndexRole = RoleViewer
