package audit_test

import (
	"context"
	"strings"
	"testing"

	"github.com/stretchr/testify/require"

	"github.com/retryd/retryd/internal/audit"
	"github.com/retryd/retryd/internal/serve"
	"github.com/retryd/retryd/migrations/pgtest"
)

func TestMain(m *testing.M) { pgtest.Main(m) }

// Record names the context's principal, writes nothing without one, cuts
// long strings and leaves nothing behind when its transaction rolls back.
func TestRecord(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	pool := pgtest.NewPool(t)
	count := func() int {
		return pgtest.Count(t, pool, `SELECT count(*) FROM audit_log`)
	}

	require.NoError(t, audit.Record(ctx, pool, audit.SourcePause, "source/shop", audit.Detail{"reason": "x"}))
	require.Zero(t, count(), "no principal: not an API action")

	as := serve.WithPrincipal(ctx, serve.Principal{Name: "oncall", Role: serve.RoleOperator})
	tx, err := pool.Begin(ctx)
	require.NoError(t, err)
	require.NoError(t, audit.Record(as, tx, audit.SourcePause, "source/shop", nil))
	require.NoError(t, tx.Rollback(ctx))
	require.Zero(t, count(), "rolled back with its action")

	// The jobs API names the scheduler's retry action as a job action.
	named := audit.Named(as, audit.JobCancel)
	require.NoError(t, audit.Record(named, pool, audit.ActionName(named, audit.RetryCancel),
		"job/j1", audit.Detail{"reason": strings.Repeat("é", 300), "until": nil, "attempt": 2}))
	page, err := audit.List(ctx, pool, audit.Filter{})
	require.NoError(t, err)
	require.Len(t, page.Entries, 1)
	e := page.Entries[0]
	require.Equal(t, []string{"oncall", "operator", audit.JobCancel, "job/j1"}, []string{e.Principal, e.Role, e.Action, e.Target})
	require.NotContains(t, string(e.Detail), "until", "nil facts are left out")
	require.Contains(t, string(e.Detail), `"attempt": 2`)
	require.Less(t, len(e.Detail), 300, "a long reason is cut")
	require.Equal(t, audit.RetryCancel, audit.ActionName(as, audit.RetryCancel), "not named: the default")
}
