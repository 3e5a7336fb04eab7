package scheduler_test

import (
	"encoding/json"
	"testing"

	"github.com/stretchr/testify/require"

	"github.com/retryd/retryd/internal/audit"
	"github.com/retryd/retryd/internal/serve"
	"github.com/retryd/retryd/pkg/contract"
	"github.com/retryd/retryd/services/scheduler"
	"github.com/retryd/retryd/stores/retrystore"
)

// A manual retry filed under an error class (the jobs API's error_class,
// alias errorType) records the class in its decision, its history entry and
// its audit detail, and leaves the item's last error class alone.
func TestManualRetryErrorClass(t *testing.T) {
	t.Parallel()
	b := setup(t)
	s := b.start(t)
	b.policy(t, "mc", "", 1, 10, 10)

	b.failTo(t, "mc", "j1", 1, "timeout", retrystore.StateDue)
	b.publish(t, contract.Failed, failed("mc", "j1", 2, "timeout"))
	b.waitRow(t, "mc", "j1", inState(retrystore.StateExhausted, 2))

	ctx := audit.Named(serve.WithPrincipal(b.ctx, serve.Principal{Name: "oncall", Role: serve.RoleOperator}), audit.JobRetry)
	rc := scheduler.RetryController{S: s.Scheduler}
	require.NoError(t, rc.RetryNow(ctx, "mc", "j1", "manual_retry", "oncall", false, "temporary_error"))
	row := b.waitRow(t, "mc", "j1", inState(retrystore.StateDue, 3))
	require.Equal(t, "timeout", row.LastErrorClass, "the item last failed with timeout")

	var manual retrystore.HistoryEntry
	for _, h := range b.history(t, "mc", "j1") {
		if h.Event == string(contract.Rescheduled) {
			manual = h
		}
	}
	require.Equal(t, contract.DecidedByManual, manual.DecidedBy)
	require.Equal(t, "temporary", manual.ErrorClass)
	var d contract.Decision
	require.NoError(t, json.Unmarshal(manual.Detail, &d))
	require.Equal(t, "temporary", d.ErrorClass)
	require.Equal(t, "manual retry by oncall, error class temporary: manual_retry", d.Note)

	page, err := audit.List(b.ctx, b.pool, audit.Filter{Action: audit.JobRetry})
	require.NoError(t, err)
	require.Len(t, page.Entries, 1)
	var ad map[string]any
	require.NoError(t, json.Unmarshal(page.Entries[0].Detail, &ad))
	require.Equal(t, map[string]any{"reason": "manual_retry", "attempt": 3.0, "error_class": "temporary"}, ad)

	err = rc.RetryNow(b.ctx, "mc", "j1", "", "oncall", false, "manual_intervention")
	var fe *contract.FieldError
	require.ErrorAs(t, err, &fe)
	require.Equal(t, "error_class", fe.Field)
	require.ErrorIs(t, err, contract.ErrInvalid)
}
