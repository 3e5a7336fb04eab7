package scheduler_test

import (
	"net/http"
	"testing"
	"time"

	"github.com/stretchr/testify/require"

	"github.com/retryd/retryd/pkg/contract"
	"github.com/retryd/retryd/stores/retrystore"
)

// executors lists the executor of each history entry, in order.
func executors(h []retrystore.HistoryEntry) []string {
	out := make([]string, len(h))
	for i, e := range h {
		out[i] = e.Executor
	}
	return out
}

// Each attempt's history row records the worker instance its failed,
// held or succeeded fact named, and the API returns it; the scheduler's
// own rows (decisions, dues) name none, and a fact without an executor
// (a worker older than the field) applies as before.
func TestHistoryRecordsTheExecutor(t *testing.T) {
	t.Parallel()
	b := setup(t)
	_, api := b.startAPI(t)
	b.policy(t, "exec", "", 3, hourMS, hourMS)

	fd := failed("exec", "a", 1, "timeout")
	fd.Executor = "Worker-A.local-101"
	b.publish(t, contract.Failed, fd)
	b.waitRow(t, "exec", "a", inState(retrystore.StateScheduled, 2))
	until := time.Now().Add(time.Hour).UTC()
	b.publish(t, contract.Held, contract.HeldData{Kind: "exec", ID: "a", Attempt: 2, Reason: contract.HoldThrottle,
		Until: &until, Executor: "worker-b-202"})
	b.waitRow(t, "exec", "a", func(r retrystore.Retry) bool {
		return r.State == retrystore.StateScheduled && r.Attempt == 3 && r.NextAttemptAt != nil
	})
	b.publish(t, contract.Succeeded, contract.SucceededData{Kind: "exec", ID: "a", Attempt: 3, Executor: "worker-c-303"})
	b.waitRow(t, "exec", "a", inState(retrystore.StateSucceeded, 3))

	h := b.history(t, "exec", "a")
	require.Equal(t, []string{"failed:1", "scheduled:2", "held:2", "rescheduled:3", "succeeded:3"}, events(h))
	require.Equal(t, []string{"Worker-A.local-101", "", "worker-b-202", "", "worker-c-303"}, executors(h))

	status, body := api.do("GET", "/v1/retries/exec/a", "")
	require.Equal(t, http.StatusOK, status)
	var got []any
	for _, e := range body["history"].([]any) {
		got = append(got, e.(map[string]any)["executor"])
	}
	require.Equal(t, []any{"Worker-A.local-101", nil, "worker-b-202", nil, "worker-c-303"}, got,
		"executor on the owner's facts, left out where unknown")

	// An older worker names no executor: its failure is decided as ever.
	b.publish(t, contract.Failed, failed("exec", "old", 1, "timeout"))
	b.waitRow(t, "exec", "old", inState(retrystore.StateScheduled, 2))
	require.Equal(t, []string{"", ""}, executors(b.history(t, "exec", "old")))
	status, body = api.do("GET", "/v1/retries/exec/old", "")
	require.Equal(t, http.StatusOK, status)
	require.NotContains(t, body["history"].([]any)[0].(map[string]any), "executor")
}
