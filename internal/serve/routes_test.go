package serve_test

import (
	"encoding/json"
	"net/http"
	"net/http/httptest"
	"testing"

	"github.com/stretchr/testify/require"

	"github.com/retryd/retryd/internal/serve"
)

type greeter struct{ name string }

func (g *greeter) hello(w http.ResponseWriter, r *http.Request) {
	serve.WriteJSON(w, http.StatusOK, map[string]string{"hello": r.PathValue("who"), "from": g.name})
}

var greeterEndpoints = []serve.Endpoint[*greeter]{
	{Route: serve.Route{Method: http.MethodGet, Path: "/v1/hello/{who}", Description: "Say hello.", Role: serve.RoleViewer}, Serve: (*greeter).hello},
	{Route: serve.Route{Method: http.MethodPost, Path: "/v1/hello", Description: "Say hello back.", Role: serve.RoleOperator}, Serve: (*greeter).hello},
}

// Every listed route is the pattern the mux serves it under, so the
// index cannot name a route that is not there.
func TestMountServesWhatRoutesLists(t *testing.T) {
	t.Parallel()
	mux := http.NewServeMux()
	serve.Mount(mux, &greeter{name: "g1"}, greeterEndpoints)
	routes := serve.Routes(greeterEndpoints)
	require.Len(t, routes, 2)
	for _, r := range routes {
		_, pattern := mux.Handler(httptest.NewRequest(r.Method, r.Path, nil))
		require.Equal(t, r.Method+" "+r.Path, pattern)
	}
	code, body := get(t, serve.Guard{}.Handler(mux), "/v1/hello/ann")
	require.Equal(t, http.StatusOK, code)
	require.JSONEq(t, `{"hello":"ann","from":"g1"}`, body)
}

func TestIndexHandler(t *testing.T) {
	t.Parallel()
	mux := http.NewServeMux()
	mux.Handle(serve.IndexPath, serve.IndexHandler(serve.Routes(greeterEndpoints), []serve.Route{
		{Method: http.MethodDelete, Path: "/v1/hello", Description: "Forget.", Role: serve.RoleAdmin},
	}))
	mux.HandleFunc("/v1/", func(w http.ResponseWriter, _ *http.Request) { w.WriteHeader(http.StatusNotFound) })

	code, body := get(t, serve.Guard{}.Handler(mux), "/v1/")
	require.Equal(t, http.StatusOK, code)
	var idx serve.Index
	require.NoError(t, json.Unmarshal([]byte(body), &idx))
	require.Equal(t, []serve.Route{
		{Method: http.MethodGet, Path: "/v1/", Description: "This index of the API's routes.", Role: serve.RoleViewer},
		{Method: http.MethodDelete, Path: "/v1/hello", Description: "Forget.", Role: serve.RoleAdmin},
		{Method: http.MethodPost, Path: "/v1/hello", Description: "Say hello back.", Role: serve.RoleOperator},
		{Method: http.MethodGet, Path: "/v1/hello/{who}", Description: "Say hello.", Role: serve.RoleViewer},
	}, idx.Routes, "sorted by path, then method")
	require.Contains(t, body, `"method":"GET","path":"/v1/","description":`)
	require.Contains(t, body, `"role":"viewer"`)

	code, _ = get(t, mux, "/v1/other")
	require.Equal(t, http.StatusNotFound, code, "the index is /v1/ only")
	rec := httptest.NewRecorder()
	mux.ServeHTTP(rec, httptest.NewRequest(http.MethodPost, "/v1/", nil))
	require.Equal(t, http.StatusNotFound, rec.Code, "the index answers GET only")
}
