package scheduler_test

import (
	"net/http"
	"testing"

	"github.com/stretchr/testify/require"

	"github.com/retryd/retryd/pkg/contract"
	"github.com/retryd/retryd/stores/retrystore"
)

// A policy set over the API with a backoff per error class: each failure
// is timed by its class's curve, and the decision names the class.
func TestPerClassBackoffThroughTheAPI(t *testing.T) {
	t.Parallel()
	b := setup(t)
	_, api := b.startAPI(t)

	status, body := api.do("PUT", "/v1/policies/cls/_", `{"name":"cls","max_retries":5,"base_delay_ms":1000,"max_delay_ms":600000,"jitter":"none",
		"class_backoff":{"rate_limit":{"base_delay_ms":120000,"max_delay_ms":3600000},"network":{"base_delay_ms":200,"max_delay_ms":2000},"timeout":{"first_delay_ms":0}}}`)
	require.Equal(t, http.StatusCreated, status, body)
	cb := body["class_backoff"].(map[string]any)
	require.Contains(t, cb, "timeout")

	for _, c := range []struct {
		id, class    string
		delayMS      int64
		backoffClass string
	}{
		{"r", "rate_limit", 120_000, "rate_limit"},
		{"n", "network", 200, "network"},
		{"t", "timeout", 0, "timeout"},
		{"x", "temporary", 1000, ""},
	} {
		b.publish(t, contract.Failed, failed("cls", c.id, 1, c.class))
		b.waitRow(t, "cls", c.id, func(r retrystore.Retry) bool { return r.PolicyName != "" })
		d := decisionOf(t, b.history(t, "cls", c.id)[1])
		require.Equal(t, c.delayMS, d.DelayMS, c.class)
		require.Equal(t, c.backoffClass, d.BackoffClass, c.class)
		require.Equal(t, contract.DecidedByBackoff, d.DecidedBy, c.class)
	}

	for _, bad := range []struct{ body, field string }{
		{`{"name":"x","max_retries":1,"base_delay_ms":1,"max_delay_ms":10,"class_backoff":{"slow":{}}}`, "class_backoff"},
		{`{"name":"x","max_retries":1,"base_delay_ms":1,"max_delay_ms":10,"class_backoff":{"network":{"base_delay_ms":50}}}`, "class_backoff.network.max_delay_ms"},
		{`{"name":"x","max_retries":1,"base_delay_ms":1,"max_delay_ms":10,"class_backoff":{"network":{"first_delay_ms":-1}}}`, "class_backoff.network.first_delay_ms"},
		{`{"name":"x","max_retries":1,"base_delay_ms":1,"max_delay_ms":10,"class_backoff":{"network":{"base":5}}}`, "base"},
	} {
		status, body := api.do("PUT", "/v1/policies/cls/_", bad.body)
		require.Equal(t, http.StatusBadRequest, status, bad.body)
		require.Equal(t, bad.field, errField(body), bad.body)
	}
}
