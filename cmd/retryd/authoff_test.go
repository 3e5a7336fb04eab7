package main

import (
	"encoding/json"
	"net/http"
	"net/url"
	"path/filepath"
	"strings"
	"testing"

	"github.com/stretchr/testify/require"

	"github.com/retryd/retryd/cmd/retryd/internal/devstack"
	"github.com/retryd/retryd/internal/audit"
	"github.com/retryd/retryd/internal/auth"
)

// asPage sends what a browser sends for a page at host whose name its
// DNS rebound to the stack's address: the page's own name in Host, and
// same-origin, which it is to the browser.
func asPage(t *testing.T, api, host, method, path, body string) (int, string) {
	t.Helper()
	req, err := http.NewRequest(method, api+path, strings.NewReader(body))
	require.NoError(t, err)
	req.Host = host
	req.Header.Set("Sec-Fetch-Site", "same-origin")
	if body != "" {
		req.Header.Set("Content-Type", "application/json")
	}
	return do(t, req)
}

// DNS rebinding against retryd dev (issue 41): with authentication off, a
// Host that is not loopback is refused on every surface, and changes
// nothing; the same request with the loopback Host is served.
func TestDevRefusesAForeignHost(t *testing.T) {
	t.Parallel()
	b := setup(t, nil)
	u, err := url.Parse(b.api)
	require.NoError(t, err)
	foreign := "rebind.example:" + u.Port()

	code, body := asPage(t, b.api, foreign, "POST", "/v1/sources/shop/pause", `{"reason":"x"}`)
	require.Equal(t, http.StatusForbidden, code, body)
	require.Contains(t, body, `"code":"foreign_host"`)
	require.Contains(t, body, "RETRYD_AUTH=tokens", "says how to serve other names")
	require.Contains(t, body, "open http://"+u.Host+"/ instead")
	for _, path := range []string{"/ui/", "/ui/api/summary", "/v1/sources", "/v1/whoami", "/metrics", "/healthz"} {
		code, body := asPage(t, b.api, foreign, "GET", path, "")
		require.Equal(t, http.StatusForbidden, code, "%s: %s", path, body)
	}
	code, body = call(t, "GET", b.api+"/v1/sources/shop", "", "")
	require.Equal(t, http.StatusNotFound, code, "the refused pause changed nothing: %s", body)

	for _, host := range []string{u.Host, "localhost:" + u.Port()} {
		code, body = asPage(t, b.api, host, "GET", "/healthz", "")
		require.Equal(t, http.StatusOK, code, "%s: %s", host, body)
	}
	code, body = asPage(t, b.api, u.Host, "POST", "/v1/sources/shop/pause", `{"reason":"x"}`)
	require.Equal(t, http.StatusOK, code, body)
	var s sourceView
	b.okJSON(t, &s, "sources", "show", "shop")
	require.True(t, s.Paused)
}

// With authentication off no token can be created, whoever asks: one
// made then would let its maker in once the same data dir runs with
// tokens. Listing and revoking stay.
func TestDevRefusesTokensWithAuthOff(t *testing.T) {
	t.Parallel()
	b := setup(t, nil)
	code, body := call(t, "POST", b.api+"/v1/tokens", "", `{"name":"rebind-admin","role":"admin"}`)
	require.Equal(t, http.StatusForbidden, code, body)
	require.Contains(t, body, "tokens can only be created with RETRYD_AUTH=tokens")
	r := b.cli(t, "tokens", "create", "--name", "ci", "--role", "viewer")
	require.Equal(t, exitFailed, r.code, r.stdout)
	require.Contains(t, r.stderr, "RETRYD_AUTH=tokens")
	require.Empty(t, r.stdout, "no secret printed")

	var list tokenList
	b.okJSON(t, &list, "tokens", "list")
	require.Empty(t, list.Tokens)
	code, body = call(t, "GET", b.api+"/v1/audit?action=token.create", "", "")
	require.Equal(t, http.StatusOK, code, body)
	var page audit.Page
	require.NoError(t, json.Unmarshal([]byte(body), &page))
	require.Empty(t, page.Entries)
}

// The embedded NATS server has no users: with authentication off it must
// be loopback, by the rule --http has (auth.Config.Validate).
func TestDevNATSHostLoopbackWithAuthOff(t *testing.T) {
	t.Parallel()
	for _, host := range []string{"0.0.0.0", "::", "10.0.0.1"} {
		_, err := devstack.New(devstack.Config{NATSHost: host})
		require.ErrorContains(t, err, "RETRYD_AUTH=off is only allowed when every listener is loopback", host)
		require.ErrorContains(t, err, "NATSHost", host)
		_, err = devstack.New(devstack.Config{NATSHost: host, Auth: auth.Config{Mode: auth.ModeTokens}})
		require.NoError(t, err, "with tokens: %s", host)
	}
	for _, host := range []string{"127.0.0.1", "localhost", "::1"} {
		_, err := devstack.New(devstack.Config{NATSHost: host})
		require.NoError(t, err, host)
	}

	// retryd dev, whose authentication is off on a loopback --http, says
	// so before it starts anything (here, a Postgres it cannot find).
	dir := t.TempDir()
	r := cli(t, "dev", "--data-dir", dir, "--http", "127.0.0.1:0", "--nats-host", "0.0.0.0", "--nats-port", "-1",
		"--database-url", "", "--postgres-bin-dir", filepath.Join(dir, "no-postgres-here"), "--log-file", filepath.Join(dir, "dev.log"))
	require.Equal(t, exitUsage, r.code, r.stderr)
	require.Contains(t, r.stderr, `but "0.0.0.0" is not`)
}

// An admin token you set yourself is yours: the banner says where it is,
// not what it is. And a NATS beyond loopback, allowed with tokens, is
// called out. Not parallel: it sets the environment.
func TestDevBannerHidesTheAdminTokenYouSet(t *testing.T) {
	secret, err := auth.NewSecret()
	require.NoError(t, err)
	t.Setenv(auth.EnvMode, "tokens")
	t.Setenv(auth.EnvAdminToken, secret)
	d := startDev(t, "--nats-host", "0.0.0.0")
	out := d.out.String()
	require.NotContains(t, out, secret)
	require.Contains(t, out, "Admin token: the one in RETRYD_ADMIN_TOKEN")
	require.Regexp(t, `WARNING\s+NATS listens on 0\.0\.0\.0 with no users`, out)
	code, body := call(t, "GET", d.url+"/v1/retries", secret, "")
	require.Equal(t, http.StatusOK, code, body)
}
