package auth_test

import (
	"encoding/json"
	"net/http"
	"testing"
	"time"

	"github.com/stretchr/testify/require"

	"github.com/retryd/retryd/internal/audit"
	"github.com/retryd/retryd/internal/auth"
	"github.com/retryd/retryd/migrations/pgtest"
)

// TestAuditTrail: token changes over the API are recorded under the
// caller's token name; refused and failed ones are not; GET /v1/audit is
// admin only, filters and pages.
func TestAuditTrail(t *testing.T) {
	t.Parallel()
	pool := pgtest.NewPool(t)
	srv, admin := tokenServer(t, pool, auth.OIDCConfig{}, nil)
	call := func(method, path, token, body string) (int, string) {
		return request(t, srv, method, path, token, body)
	}
	page := func(query, token string) audit.Page {
		code, body := call("GET", "/v1/audit"+query, token, "")
		require.Equal(t, http.StatusOK, code, body)
		var p audit.Page
		require.NoError(t, json.Unmarshal([]byte(body), &p))
		return p
	}
	rows := func() int {
		return pgtest.Count(t, pool, `SELECT count(*) FROM audit_log`)
	}
	require.Zero(t, rows(), "the bootstrap token is ensured, not asked for: no entry")

	code, body := call("POST", "/v1/tokens", admin, `{"name":"oncall","role":"operator"}`)
	require.Equal(t, http.StatusCreated, code, body)
	var op auth.Created
	require.NoError(t, json.Unmarshal([]byte(body), &op))

	// Refused (403) and failed (409: the name is taken) create nothing.
	code, body = call("POST", "/v1/tokens", op.Secret, `{"name":"sneaky","role":"admin"}`)
	require.Equal(t, http.StatusForbidden, code, body)
	code, body = call("POST", "/v1/tokens", admin, `{"name":"oncall","role":"viewer"}`)
	require.Equal(t, http.StatusConflict, code, body)
	code, _ = call("GET", "/v1/audit", op.Secret, "")
	require.Equal(t, http.StatusForbidden, code, "an operator may not read the audit trail")
	require.Equal(t, 1, rows())

	code, body = call("DELETE", "/v1/tokens/"+op.ID, admin, "")
	require.Equal(t, http.StatusOK, code, body)
	code, body = call("DELETE", "/v1/tokens/nosuch", admin, "")
	require.Equal(t, http.StatusNotFound, code, body)
	for i := range 3 {
		code, body = call("POST", "/v1/tokens", admin, `{"name":"ci-`+string(rune('a'+i))+`","role":"viewer","expires_at":"`+time.Now().Add(time.Hour).UTC().Format(time.RFC3339)+`"}`)
		require.Equal(t, http.StatusCreated, code, body)
	}
	require.Equal(t, 5, rows())
	require.Zero(t, pgtest.Count(t, pool, `SELECT count(*) FROM audit_log WHERE detail::text LIKE '%rtd_%'`), "no entry holds a token")

	all := page("", admin)
	require.Len(t, all.Entries, 5)
	require.Empty(t, all.NextCursor)
	last := all.Entries[4]
	require.Equal(t, audit.TokenCreate, last.Action, "oldest last")
	require.Equal(t, auth.BootstrapName, last.Principal)
	require.Equal(t, "admin", last.Role)
	require.Equal(t, "token/"+op.ID, last.Target)
	require.JSONEq(t, `{"name":"oncall","role":"operator"}`, string(last.Detail))
	require.Equal(t, audit.TokenRevoke, all.Entries[3].Action)

	revokes := page("?action=token.revoke", admin)
	require.Len(t, revokes.Entries, 1)
	require.Equal(t, "token/"+op.ID, revokes.Entries[0].Target)
	require.Empty(t, page("?principal=oncall", admin).Entries)
	require.Len(t, page("?principal=bootstrap&since="+time.Now().Add(-time.Minute).UTC().Format(time.RFC3339), admin).Entries, 5)
	require.Empty(t, page("?since="+time.Now().Add(time.Minute).UTC().Format(time.RFC3339), admin).Entries)

	// Pages of 2: 2, 2, 1, in order, none twice.
	var seen []int64
	cursor := ""
	for i := 0; ; i++ {
		q := "?limit=2"
		if cursor != "" {
			q += "&cursor=" + cursor
		}
		p := page(q, admin)
		for _, e := range p.Entries {
			seen = append(seen, e.ID)
		}
		cursor = p.NextCursor
		if cursor == "" {
			require.Equal(t, 2, i)
			break
		}
	}
	require.Len(t, seen, 5)
	for i, e := range all.Entries {
		require.Equal(t, e.ID, seen[i])
	}
	for _, q := range []string{"?limit=0", "?limit=501", "?cursor=zz", "?since=yesterday", "?who=x"} {
		code, body := call("GET", "/v1/audit"+q, admin, "")
		require.Equal(t, http.StatusBadRequest, code, "%s: %s", q, body)
	}
}
