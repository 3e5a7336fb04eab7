package demo

import (
	"context"
	"encoding/json"
	"net/http"
	"net/http/httptest"
	"slices"
	"sync"
	"testing"
	"time"

	"github.com/rs/zerolog"
	"github.com/stretchr/testify/require"

	"github.com/retryd/retryd/pkg/policy"
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
	return &Demo{api: newClient(srv.URL, "", nil), log: zerolog.Nop()}
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

// A demo policy as the API hands it back (stored, versioned, classes in
// any order) is the same policy, so a restart writes no new version; and
// each is valid, so the first start can write it.
func TestPoliciesReadBackAreTheSame(t *testing.T) {
	t.Parallel()
	for _, want := range Policies() {
		stored := want
		stored.Version, stored.UpdatedBy, stored.UpdatedAt = 4, "api", time.Now()
		stored.NonRetryableClasses = slices.Clone(want.NonRetryableClasses)
		slices.Reverse(stored.NonRetryableClasses)
		raw, err := json.Marshal(stored)
		require.NoError(t, err)
		var cur policy.Policy
		require.NoError(t, json.Unmarshal(raw, &cur))
		require.True(t, same(cur, want), "%s: %s", want.Name, raw)

		cur.Backoff.JitterMax += time.Millisecond
		require.False(t, same(cur, want), "%s: a changed jitter is a change", want.Name)

		want.Version = 1
		require.NoError(t, want.Validate(), want.Name)
	}
}
