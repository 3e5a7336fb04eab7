package scheduler_test

import (
	"net/http"
	"testing"
	"time"

	"github.com/stretchr/testify/require"

	"github.com/retryd/retryd/pkg/contract"
	"github.com/retryd/retryd/stores/retrystore"
)

// heldOf is the held object of a retry as the API answers it, nil when
// the answer has none.
func heldOf(t *testing.T, retry any) map[string]any {
	t.Helper()
	r, ok := retry.(map[string]any)
	require.True(t, ok, "a retry is an object: %v", retry)
	h, _ := r["held"].(map[string]any)
	return h
}

func apiTime(t *testing.T, v any) time.Time {
	t.Helper()
	s, ok := v.(string)
	require.True(t, ok, "a time is a string: %v", v)
	at, err := time.Parse(time.RFC3339Nano, s)
	require.NoError(t, err)
	return at
}

// The API shows a held item as held: its reason, hold key and since, the
// end of its hold where one is known (an owner's until, a release's
// slot) and otherwise none, only the bound of max_hold; a failed item, or
// one an operator retried, has no hold.
func TestRetriesAPIShowsHolds(t *testing.T) {
	t.Parallel()
	b := setup(t)
	_, api := b.startAPI(t)
	b.policy(t, "hv", "", 3, hourMS, hourMS)
	maxHold := (30 * 24 * time.Hour).Milliseconds()

	b.publish(t, contract.Held, heldUnder("shop", "hv", "paused", contract.HoldPause, nil))
	until := time.Now().Add(time.Hour).UTC().Truncate(time.Millisecond)
	b.publish(t, contract.Held, heldUnder("shop", "hv", "throttled", contract.HoldThrottle, &until))
	b.publish(t, contract.Held, heldUnder("t1", "hv", "slot", contract.HoldConcurrency, nil))
	b.publish(t, contract.Held, heldUnder("later", "hv", "released", contract.HoldPause, nil))
	b.publish(t, contract.Held, heldUnder("ops", "hv", "manual", contract.HoldPause, nil))
	b.publish(t, contract.Failed, failed("hv", "failing", 1, "timeout"))
	for _, id := range []string{"paused", "throttled", "slot", "released", "manual", "failing"} {
		b.waitRow(t, "hv", id, inState(retrystore.StateScheduled, 2))
	}

	status, body := api.do("GET", "/v1/retries/hv/paused", "")
	require.Equal(t, http.StatusOK, status)
	retry := body["retry"].(map[string]any)
	require.Equal(t, "scheduled", retry["state"], "state keeps its values; held is a field of its own")
	h := heldOf(t, retry)
	require.NotNil(t, h, "a paused item is held: %v", retry)
	require.Equal(t, "pause", h["reason"])
	require.Equal(t, "shop", h["key"])
	require.NotContains(t, h, "until", "a pause without an end lasts until released")
	require.EqualValues(t, maxHold, h["max_hold_ms"])
	since := apiTime(t, h["since"])
	require.True(t, since.Equal(apiTime(t, retry["held_since"])))
	require.True(t, since.Add(30*24*time.Hour).Equal(apiTime(t, h["max_hold_at"])))

	_, body = api.do("GET", "/v1/retries/hv/throttled", "")
	h = heldOf(t, body["retry"])
	require.Equal(t, "throttle", h["reason"])
	require.True(t, until.Equal(apiTime(t, h["until"])), "the owner's end of the hold: %v", h["until"])

	_, body = api.do("GET", "/v1/retries/hv/slot", "")
	h = heldOf(t, body["retry"])
	require.Equal(t, "concurrency", h["reason"])
	require.NotContains(t, h, "until", "looked at again after a backoff delay, but its end is not known")

	_, body = api.do("GET", "/v1/retries/hv/failing", "")
	require.Nil(t, heldOf(t, body["retry"]), "a failure is not a hold")

	// A paced release from an hour on: the hold ends at the item's slot.
	pace := &contract.ReleasePace{From: time.Now().Add(time.Hour).Truncate(time.Second), Limit: 1, WindowMS: 1000}
	b.publish(t, contract.Released, contract.ReleasedData{Kind: "hv", HoldKey: "later", Reason: contract.ReleaseResume,
		By: "test", ReleasedAt: time.Now(), Pace: pace})
	b.waitRow(t, "hv", "released", func(r retrystore.Retry) bool {
		return r.NextAttemptAt != nil && r.NextAttemptAt.Equal(pace.DueAt(0))
	})
	_, body = api.do("GET", "/v1/retries/hv/released", "")
	h = heldOf(t, body["retry"])
	require.NotNil(t, h, "held until its slot")
	require.True(t, pace.DueAt(0).Equal(apiTime(t, h["until"])), "released: the hold ends at its slot, %v", h["until"])

	// Retried by hand, the item runs: it is not held any more.
	status, body = api.do("POST", "/v1/retries/hv/manual/retry", `{"reason":"go"}`)
	require.Equal(t, http.StatusOK, status)
	require.Nil(t, heldOf(t, body["retry"]), "a manual retry ends the hold: %v", body["retry"])

	// The list shows the same.
	status, body = api.do("GET", "/v1/retries?kind=hv&state=scheduled&limit=100", "")
	require.Equal(t, http.StatusOK, status)
	heldIDs := map[string]string{}
	for _, r := range body["retries"].([]any) {
		if h := heldOf(t, r); h != nil {
			heldIDs[r.(map[string]any)["id"].(string)] = h["reason"].(string)
		}
	}
	require.Equal(t, map[string]string{"paused": "pause", "throttled": "throttle", "slot": "concurrency", "released": "pause"}, heldIDs)
}
