package dashboard_test

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"net/http"
	"net/http/httptest"
	"regexp"
	"strings"
	"testing"

	"github.com/stretchr/testify/require"

	"github.com/retryd/retryd/internal/dashboard"
	"github.com/retryd/retryd/internal/serve"
)

func get(t *testing.T, h http.Handler, path string) *httptest.ResponseRecorder {
	t.Helper()
	rec := httptest.NewRecorder()
	// A loopback Host: a Guard with authentication off serves no other.
	h.ServeHTTP(rec, httptest.NewRequest(http.MethodGet, "http://127.0.0.1"+path, nil))
	return rec
}

func TestIndex(t *testing.T) {
	t.Parallel()
	h := dashboard.Handler(dashboard.Config{APIBase: "https://api.example.com/", Title: "ops <retryd>"})
	rec := get(t, h, "/")
	require.Equal(t, http.StatusOK, rec.Code)
	body := rec.Body.String()
	require.Contains(t, body, `<meta name="retryd-api-base" content="https://api.example.com">`)
	require.Contains(t, body, `<meta name="retryd-refresh-ms" content="3000">`)
	require.Contains(t, body, "<title>ops &lt;retryd&gt;</title>", "the title is escaped")
	csp := rec.Header().Get("Content-Security-Policy")
	require.Contains(t, csp, "script-src 'self'")
	require.Contains(t, csp, "connect-src 'self' https://api.example.com")
	require.Equal(t, "nosniff", rec.Header().Get("X-Content-Type-Options"))
	require.Equal(t, "DENY", rec.Header().Get("X-Frame-Options"))
}

func TestAssets(t *testing.T) {
	t.Parallel()
	h := dashboard.Handler(dashboard.Config{})
	index := get(t, h, "/").Body.String()
	// Every script and stylesheet the page and its modules load is served
	// with a type the browser accepts for it.
	refs := regexp.MustCompile(`(?:src|href)="([\w/.-]+\.(?:js|css))"`).FindAllStringSubmatch(index, -1)
	require.NotEmpty(t, refs)
	seen := map[string]bool{}
	var visit func(path string)
	visit = func(path string) {
		if seen[path] {
			return
		}
		seen[path] = true
		rec := get(t, h, "/"+path)
		require.Equal(t, http.StatusOK, rec.Code, path)
		ct := rec.Header().Get("Content-Type")
		if strings.HasSuffix(path, ".js") {
			require.Contains(t, ct, "javascript", path)
			for _, m := range regexp.MustCompile(`from "\./([\w.-]+\.js)"`).FindAllStringSubmatch(rec.Body.String(), -1) {
				visit("js/" + m[1])
			}
		} else {
			require.Contains(t, ct, "text/css", path)
		}
	}
	for _, r := range refs {
		visit(r[1])
	}
	require.True(t, seen["js/retries.js"] && seen["js/analytics.js"] && seen["js/policies.js"] &&
		seen["js/jobs.js"] && seen["js/jobs-bulk.js"] && seen["js/runs.js"] && seen["js/list.js"], "modules reached: %v", seen)
	require.Equal(t, http.StatusNotFound, get(t, h, "/nothing.js").Code)
}

func TestSummary(t *testing.T) {
	t.Parallel()
	rec := get(t, serve.Guard{}.Handler(dashboard.Handler(dashboard.Config{})), "/api/summary")
	require.Equal(t, http.StatusNotFound, rec.Code, "no summary without Config.Summary")

	h := dashboard.Handler(dashboard.Config{Summary: func(context.Context) (dashboard.Summary, error) {
		return dashboard.Summary{Counts: []dashboard.Count{{Kind: "job", State: "scheduled", Count: 3}}}, nil
	}})
	rec = get(t, serve.Guard{}.Handler(h), "/api/summary")
	require.Equal(t, http.StatusOK, rec.Code)
	var sum dashboard.Summary
	require.NoError(t, json.Unmarshal(rec.Body.Bytes(), &sum))
	require.Equal(t, []dashboard.Count{{Kind: "job", State: "scheduled", Count: 3}}, sum.Counts)

	failing := dashboard.Handler(dashboard.Config{Summary: func(context.Context) (dashboard.Summary, error) {
		return dashboard.Summary{}, errors.New("database down: password=secret")
	}})
	rec = get(t, serve.Guard{}.Handler(failing), "/api/summary")
	require.Equal(t, http.StatusInternalServerError, rec.Code)
	require.NotContains(t, rec.Body.String(), "secret", "internal errors are not shown")
}

// The embedded files hold no inline script or style, which the Content
// Security Policy would block.
func TestNoInlineCode(t *testing.T) {
	t.Parallel()
	h := dashboard.Handler(dashboard.Config{})
	body := get(t, h, "/").Body.String()
	require.NotRegexp(t, `<script(?:\s[^>]*)?>[^<]`, body)
	require.NotContains(t, body, "<style")
	require.NotContains(t, body, " style=")
	require.NotRegexp(t, ` on[a-z]+=`, body)
}

func Example() {
	mux := http.NewServeMux()
	mux.Handle("/ui/", http.StripPrefix("/ui", dashboard.Handler(dashboard.Config{Title: "retryd"})))
	srv := httptest.NewServer(mux)
	defer srv.Close()

	resp, err := http.Get(srv.URL + "/ui/")
	if err != nil {
		panic(err)
	}
	defer resp.Body.Close()
	page, _ := io.ReadAll(resp.Body)
	fmt.Println(resp.StatusCode, strings.Contains(string(page), "<title>retryd</title>"))
	// Output: 200 true
}
