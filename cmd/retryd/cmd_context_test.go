package main

import (
	"net/http"
	"net/http/httptest"
	"os"
	"path/filepath"
	"strings"
	"sync"
	"testing"

	"github.com/stretchr/testify/require"
)

// fakeTokensAPI answers GET /v1/tokens with an empty list and records the
// Authorization header of each request.
func fakeTokensAPI(t *testing.T) (string, func() []string) {
	t.Helper()
	var mu sync.Mutex
	var seen []string
	srv := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		mu.Lock()
		seen = append(seen, r.Header.Get("Authorization"))
		mu.Unlock()
		w.Header().Set("Content-Type", "application/json")
		_, _ = w.Write([]byte(`{"tokens":[]}`))
	}))
	t.Cleanup(srv.Close)
	return srv.URL, func() []string {
		mu.Lock()
		defer mu.Unlock()
		return append([]string(nil), seen...)
	}
}

// A saved context supplies the API and the token; a flag still wins for
// one command; the file is the owner's only and ls never prints a token.
func TestSavedContexts(t *testing.T) {
	t.Parallel()
	if os.Getenv(envAPI) != "" || os.Getenv(envToken) != "" || os.Getenv(envContext) != "" {
		t.Skip("the environment sets the API, token or context, which win over a saved context")
	}
	config := filepath.Join(t.TempDir(), "retryd", "contexts.json")
	prod, prodSeen := fakeTokensAPI(t)
	stage, stageSeen := fakeTokensAPI(t)

	r := cli(t, "--config", config, "context", "save", "prod", "--api", prod, "--token", "rtd_prod")
	require.Equal(t, exitOK, r.code, r.stderr)
	r = cli(t, "--config", config, "context", "save", "stage", "--api", stage, "--token", "rtd_stage")
	require.Equal(t, exitOK, r.code, r.stderr)
	info, err := os.Stat(config)
	require.NoError(t, err)
	require.Equal(t, os.FileMode(0o600), info.Mode().Perm(), "the file holds tokens")

	// The first saved is the current one.
	r = cli(t, "--config", config, "tokens", "list")
	require.Equal(t, exitOK, r.code, r.stderr)
	require.Equal(t, []string{"Bearer rtd_prod"}, prodSeen())

	r = cli(t, "--config", config, "context", "use", "stage")
	require.Equal(t, exitOK, r.code, r.stderr)
	r = cli(t, "--config", config, "tokens", "list")
	require.Equal(t, exitOK, r.code, r.stderr)
	r = cli(t, "--config", config, "tokens", "list", "--token", "rtd_flag")
	require.Equal(t, exitOK, r.code, r.stderr)
	require.Equal(t, []string{"Bearer rtd_stage", "Bearer rtd_flag"}, stageSeen(), "a flag wins over the context")
	r = cli(t, "--config", config, "--context", "prod", "tokens", "list")
	require.Equal(t, exitOK, r.code, r.stderr)
	require.Len(t, prodSeen(), 2, "--context picks one for a command")

	r = cli(t, "--config", config, "context", "ls")
	require.Equal(t, exitOK, r.code, r.stderr)
	require.Contains(t, r.stdout, "stage")
	require.NotContains(t, r.stdout, "rtd_", "never a token")
	require.Regexp(t, `(?m)^\*\s+stage\s`, r.stdout)

	r = cli(t, "--config", config, "--context", "nope", "tokens", "list")
	require.Equal(t, exitUsage, r.code)
	require.Contains(t, r.stderr, `no saved context "nope"`)
	r = cli(t, "--config", config, "context", "use", "nope")
	require.Equal(t, exitFailed, r.code)

	r = cli(t, "--config", config, "context", "rm", "stage")
	require.Equal(t, exitOK, r.code, r.stderr)
	r = cli(t, "--config", config, "context", "ls")
	require.False(t, strings.Contains(r.stdout, "stage"), r.stdout)
}
