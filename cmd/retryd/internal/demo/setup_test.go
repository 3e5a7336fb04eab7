package demo

import (
	"context"
	"net/http"
	"net/http/httptest"
	"sync"
	"testing"

	"github.com/rs/zerolog"
	"github.com/stretchr/testify/require"
)

// fakeSources answers the source API from a map and records the writes.
type fakeSources struct {
	mu     sync.Mutex
	paused map[string]string // source -> pause reason ("" not paused)
	exists map[string]bool
	writes []string
}

func (f *fakeSources) ServeHTTP(w http.ResponseWriter, r *http.Request) {
	f.mu.Lock()
	defer f.mu.Unlock()
	source := r.PathValue("source")
	if r.Method != http.MethodGet {
		f.writes = append(f.writes, r.Method+" "+r.URL.Path)
	}
	switch {
	case r.Method == http.MethodGet && !f.exists[source]:
		w.WriteHeader(http.StatusNotFound)
		return
	case r.Method == http.MethodGet:
		reason := f.paused[source]
		_, _ = w.Write(mustJSON(map[string]any{"paused": reason != "", "pause_reason": reason}))
		return
	}
	_, _ = w.Write([]byte(`{}`))
}

func newFake(t *testing.T, f *fakeSources) *Demo {
	mux := http.NewServeMux()
	mux.Handle("/v1/sources/{source}", f)
	mux.Handle("/v1/sources/{source}/{action}", f)
	srv := httptest.NewServer(mux)
	t.Cleanup(srv.Close)
	return &Demo{api: newClient(srv.URL), log: zerolog.Nop()}
}

// The demo configures its sources on the first start only: a source that
// already has a gate (set by an operator, or an earlier start) is kept.
func TestSourcesAreSetOnFirstStartOnly(t *testing.T) {
	t.Parallel()
	f := &fakeSources{exists: map[string]bool{SourceShop: true}}
	d := newFake(t, f)
	require.NoError(t, d.setSourceOnce(context.Background(), SourceShop, map[string]any{"rate_limit": 3}))
	require.NoError(t, d.setSourceOnce(context.Background(), SourcePartner, map[string]any{}))
	require.Equal(t, []string{"PUT /v1/sources/" + SourcePartner}, f.writes)
}

// The scripted pause never overrides an operator's pause, and never
// resumes a pause that is not its own.
func TestScriptedPauseLeavesOperatorPausesAlone(t *testing.T) {
	t.Parallel()
	f := &fakeSources{exists: map[string]bool{SourcePartner: true}, paused: map[string]string{SourcePartner: "operator: incident"}}
	d := newFake(t, f)
	require.NoError(t, d.pauseOnce(context.Background()))
	require.Empty(t, f.writes)
}
