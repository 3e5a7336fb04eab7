package main

import (
	"context"
	"net/http"
	"slices"
	"strings"
	"testing"

	"github.com/getkin/kin-openapi/openapi3"
	"github.com/stretchr/testify/require"

	"github.com/retryd/retryd/internal/auth"
	"github.com/retryd/retryd/internal/serve"
	"github.com/retryd/retryd/services/ingress"
	"github.com/retryd/retryd/services/jobs"
	"github.com/retryd/retryd/services/scheduler"
	"github.com/retryd/retryd/services/triggers"
)

// specPath is the API's contract, docs/openapi.yaml.
const specPath = "../../docs/openapi.yaml"

// roleExtension names, on each operation of the spec, the role the route
// needs.
const roleExtension = "x-retryd-role"

// loadSpec reads and validates docs/openapi.yaml.
func loadSpec(t *testing.T) *openapi3.T {
	t.Helper()
	doc, err := openapi3.NewLoader().LoadFromFile(specPath)
	require.NoError(t, err, "load %s", specPath)
	require.NoError(t, doc.Validate(context.Background()), "validate %s", specPath)
	return doc
}

// servedRoute is a route the dev stack serves, with the role the spec's
// x-retryd-role must name.
type servedRoute struct{ method, path, role string }

func (r servedRoute) String() string { return r.method + " " + r.path }

// servedRoutes is every route the dev stack serves: the services' lists
// (as GET /v1/ indexes them), the index itself, and what serve.NewMux and
// serve.Guard add to every binary, and the dashboard's one JSON route (its
// page and assets under /ui/ are HTML and files). whoami needs a valid
// token of any role, which no serve.Role names: the spec says "any".
func servedRoutes() []servedRoute {
	var out []servedRoute
	for _, r := range slices.Concat(scheduler.Routes(), ingress.Routes(), triggers.Routes(), jobs.Routes(), auth.Routes()) {
		out = append(out, servedRoute{r.Method, r.Path, r.Role.String()})
	}
	public := serve.RolePublic.String()
	return append(out,
		// The index's pattern ends in {$}: it serves /v1/ and nothing under it.
		servedRoute{http.MethodGet, strings.TrimSuffix(strings.TrimPrefix(serve.IndexPath, "GET "), "{$}"), serve.IndexRole.String()},
		servedRoute{http.MethodGet, serve.WhoamiPath, "any"},
		servedRoute{http.MethodPost, serve.LoginPath, public},
		servedRoute{http.MethodPost, serve.LogoutPath, public},
		servedRoute{http.MethodGet, "/healthz", public},
		servedRoute{http.MethodGet, "/readyz", public},
		servedRoute{http.MethodGet, "/metrics", public},
		servedRoute{http.MethodGet, "/ui/api/summary", serve.RoleViewer.String()},
	)
}

// specOperations lists the spec's operations by "METHOD path".
func specOperations(doc *openapi3.T) map[string]*openapi3.Operation {
	ops := map[string]*openapi3.Operation{}
	for path, item := range doc.Paths.Map() {
		for method, op := range item.Operations() {
			ops[method+" "+path] = op
		}
	}
	return ops
}

// The spec and the served routes are the same set, both ways, and each
// operation names the role its route needs.
func TestOpenAPICoversEveryRoute(t *testing.T) {
	t.Parallel()
	doc := loadSpec(t)
	ops := specOperations(doc)
	served := map[string]bool{}
	for _, r := range servedRoutes() {
		served[r.String()] = true
		op, ok := ops[r.String()]
		if !ok {
			t.Errorf("%s is served but missing from %s", r, specPath)
			continue
		}
		require.Equal(t, r.role, op.Extensions[roleExtension], "%s: %s", r, roleExtension)
		require.NotEmpty(t, op.Summary, "%s: summary", r)
		require.NotEmpty(t, op.Tags, "%s: tags", r)
		require.NotEmpty(t, op.OperationID, "%s: operationId", r)
		if r.role == serve.RolePublic.String() {
			require.NotNil(t, op.Security, "%s is public: it must say security: []", r)
			require.Empty(t, *op.Security, "%s is public: it must say security: []", r)
		} else {
			require.Nil(t, op.Security, "%s needs a token: it keeps the document's bearer security", r)
		}
	}
	for key := range ops {
		if !served[key] {
			t.Errorf("%s is in %s but no route serves it", key, specPath)
		}
	}
}
