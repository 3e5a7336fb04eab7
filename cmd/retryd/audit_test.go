package main

import (
	"encoding/json"
	"net/http"
	"strings"
	"testing"

	"github.com/stretchr/testify/require"

	"github.com/retryd/retryd/internal/auth"
)

// Actions through the API, across services, are recorded under the
// token's name (never the body's "by"); refused and failed ones are not;
// `retryd audit` lists, filters and pages them, for an admin only.
func TestAuditCLI(t *testing.T) {
	t.Parallel()
	b := setupTokens(t)
	admin := b.stack.AdminToken()
	secret := func(name, role string) string {
		code, body := call(t, "POST", b.api+"/v1/tokens", admin, `{"name":"`+name+`","role":"`+role+`"}`)
		require.Equal(t, http.StatusCreated, code, body)
		var c auth.Created
		require.NoError(t, json.Unmarshal([]byte(body), &c))
		return c.Secret
	}
	oncall, looker := secret("oncall", "operator"), secret("looker", "viewer")
	must := func(want int, method, path, token, body string) string {
		t.Helper()
		code, resp := call(t, method, b.api+path, token, body)
		require.Equal(t, want, code, "%s %s: %s", method, path, resp)
		return resp
	}
	must(http.StatusOK, "POST", "/v1/sources/shop/pause", oncall, `{"reason":"partner maintenance"}`)
	must(http.StatusForbidden, "POST", "/v1/sources/shop/pause", looker, `{"reason":"x"}`)
	must(http.StatusForbidden, "PUT", "/v1/sources/shop", oncall, `{"rate_limit":10,"rate_window":"1s"}`)
	must(http.StatusUnauthorized, "POST", "/v1/sources/shop/resume", auth.Prefix+strings.Repeat("x", 43), "")
	must(http.StatusOK, "PUT", "/v1/sources/shop", admin, `{"rate_limit":10,"rate_window":"1s"}`)
	must(http.StatusCreated, "PUT", "/v1/policies/job/audited", admin,
		`{"name":"audited","max_retries":3,"base_delay_ms":1000,"max_delay_ms":2000,"updated_by":"mallory"}`)
	must(http.StatusOK, "POST", "/v1/sources/shop/resume", oncall, "")
	must(http.StatusNotFound, "POST", "/v1/events/nosuch/cancel", oncall, `{"reason":"x"}`)
	must(http.StatusNotFound, "POST", "/v1/jobs/nosuch/cancel", oncall, `{"reason":"x"}`)
	created := must(http.StatusCreated, "POST", "/v1/triggers", admin, `{"name":"t","source":"shop","event_type":"order.paid","workflow":"w"}`)
	var trig struct {
		ID string `json:"id"`
	}
	require.NoError(t, json.Unmarshal([]byte(created), &trig))
	must(http.StatusForbidden, "DELETE", "/v1/triggers/"+trig.ID, oncall, "")
	must(http.StatusNoContent, "DELETE", "/v1/triggers/"+trig.ID, admin, "")

	want := []string{ // newest first
		"bootstrap trigger.delete trigger/" + trig.ID,
		"bootstrap trigger.create trigger/" + trig.ID,
		"oncall source.resume source/shop",
		"bootstrap policy.put policy/job/audited",
		"bootstrap source.settings source/shop",
		"oncall source.pause source/shop",
		"bootstrap token.create token/",
		"bootstrap token.create token/",
	}
	var page auditPage
	b.okJSON(t, &page, "--token", admin, "audit")
	require.Len(t, page.Entries, len(want))
	for i, e := range page.Entries {
		require.True(t, strings.HasPrefix(e.Principal+" "+e.Action+" "+e.Target, want[i]), "entry %d: %+v", i, e)
	}
	require.Equal(t, "operator", page.Entries[5].Role)
	require.JSONEq(t, `{"reason":"partner maintenance"}`, string(page.Entries[5].Detail))

	table := b.ok(t, "--token", admin, "audit", "--principal", "oncall", "--since", "1h")
	require.Contains(t, table, "PRINCIPAL")
	require.Contains(t, table, "source.pause")
	require.Contains(t, table, "source.resume")
	require.NotContains(t, table, "bootstrap")
	require.NotContains(t, table, "mallory")
	b.okJSON(t, &page, "--token", admin, "audit", "--action", "source.settings")
	require.Len(t, page.Entries, 1)
	require.Equal(t, "bootstrap", page.Entries[0].Principal)

	// Pages of 2, fetched to the end.
	r := b.cli(t, "--token", admin, "audit", "--limit", "2")
	require.Equal(t, exitOK, r.code, r.stderr)
	require.Contains(t, r.stderr, "--cursor")
	b.okJSON(t, &page, "--token", admin, "audit", "--limit", "2", "--all")
	require.Len(t, page.Entries, len(want))

	r = b.cli(t, "--token", oncall, "audit")
	require.Equal(t, exitFailed, r.code, "an operator may not read the audit trail")
	require.Contains(t, r.stderr, "HTTP 403 forbidden")
	r = b.cli(t, "--token", admin, "audit", "--limit", "0")
	require.Equal(t, exitUsage, r.code)
}
