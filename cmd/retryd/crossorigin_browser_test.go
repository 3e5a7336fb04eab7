package main

import (
	"fmt"
	"net/http"
	"net/http/httptest"
	"net/url"
	"testing"

	"github.com/chromedp/chromedp"
	"github.com/stretchr/testify/require"
)

// attackPage is a page on another origin that tries, through the visitor's
// browser, what needs no CORS preflight: no-cors fetches with a text/plain
// body and a form post, against an operator route (pause a source) and an
// admin one (create a trigger); and a JSON fetch, which needs a preflight
// the API never grants.
const attackPage = `<!doctype html><html><body>
<iframe name="sink" style="display:none"></iframe>
<form id="f" method="POST" enctype="text/plain" target="sink" action="%[1]s/v1/sources/xsite/pause">
<input name='{"reason":"form","x":"' value='"}'></form>
<script>
const api = %[1]q;
const attempts = [
  fetch(api + "/v1/sources/xsite/pause", {method: "POST", mode: "no-cors",
    headers: {"Content-Type": "text/plain"}, body: '{"reason":"pwned"}'}),
  fetch(api + "/v1/triggers", {method: "POST", mode: "no-cors", headers: {"Content-Type": "text/plain"},
    body: JSON.stringify({id: "xsite-trigger", name: "x", source: "xsite", event_type: "e", workflow: "w"})}),
  fetch(api + "/v1/sources/xsite/pause", {method: "POST",
    headers: {"Content-Type": "application/json"}, body: '{"reason":"json"}'}),
].map((p) => p.then(() => "sent", (e) => "blocked: " + e));
document.getElementById("f").submit();
Promise.all(attempts).then((r) => { window.results = r; setTimeout(() => { window.done = true; }, 500); });
</script></body></html>`

// TestCrossOriginPageCannotAct opens a page of another origin in Chromium
// and lets it post to the API: nothing changes.
func TestCrossOriginPageCannotAct(t *testing.T) {
	t.Parallel()
	ctx := browser(t)
	b := setup(t, nil)
	b.ok(t, "sources", "set", "xsite", "--rate-limit", "10", "--window", "1s")

	evil := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, _ *http.Request) {
		w.Header().Set("Content-Type", "text/html; charset=utf-8")
		_, _ = fmt.Fprintf(w, attackPage, b.api)
	}))
	t.Cleanup(evil.Close)
	require.NoError(t, chromedp.Do(ctx, chromedp.Navigate(evil.URL), poll(`window.done === true`)))
	t.Logf("the page's fetches: %v", eval[[]string](t, ctx, `window.results`))

	var src struct {
		Paused bool `json:"paused"`
	}
	b.okJSON(t, &src, "sources", "show", "xsite")
	require.False(t, src.Paused, "a page of another origin paused a source")
	resp, err := http.Get(b.api + "/v1/triggers/xsite-trigger")
	require.NoError(t, err)
	resp.Body.Close()
	require.Equal(t, http.StatusNotFound, resp.StatusCode, "a page of another origin created a trigger")

	// The same request without browser headers (curl, the CLI) works: the
	// refusal is about the origin, not the route.
	b.ok(t, "sources", "pause", "xsite", "--reason", "operator")
	b.okJSON(t, &src, "sources", "show", "xsite")
	require.True(t, src.Paused)
}

// TestRebindingPageCannotAct is DNS rebinding in Chromium: the browser
// resolves the page's name, rebind.example, to retryd dev's address (the
// resolver rule stands in for the attacker's DNS), so the page and the
// API are one origin to it. The page cannot load the dashboard, and its
// same-origin fetch cannot pause a source: authentication is off, and
// the Host it sends is not loopback.
func TestRebindingPageCannotAct(t *testing.T) {
	t.Parallel()
	ctx := browser(t, chromedp.Flag("host-resolver-rules", "MAP rebind.example 127.0.0.1"))
	b := setup(t, nil)
	u, err := url.Parse(b.api)
	require.NoError(t, err)

	page := "http://rebind.example:" + u.Port()
	require.NoError(t, chromedp.Do(ctx, chromedp.Navigate(page+"/ui/")))
	require.Contains(t, eval[string](t, ctx, `document.body.innerText`), `"code":"foreign_host"`, "the dashboard is not served to it")
	require.NoError(t, chromedp.Do(ctx, chromedp.Evaluate[chromedp.Void](`fetch("/v1/sources/rebound/pause", {method: "POST",
  headers: {"Content-Type": "application/json"}, body: '{"reason":"rebound"}'})
  .then((r) => r.text().then((body) => { window.result = r.status + " " + body; }), (e) => { window.result = "blocked: " + e; })`),
		poll(`window.result !== undefined`)))
	res := eval[string](t, ctx, `window.result`)
	require.Contains(t, res, `403 {"error":{"code":"foreign_host"`)

	code, body := call(t, "GET", b.api+"/v1/sources/rebound", "", "")
	require.Equal(t, http.StatusNotFound, code, "a rebinding page paused a source: %s", body)
}
