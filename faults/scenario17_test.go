package faults_test

import (
	"context"
	"crypto/rand"
	"encoding/base64"
	"encoding/json"
	"fmt"
	"io"
	"maps"
	"net/http"
	"slices"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/retryd/retryd/faults/harness"
	"github.com/retryd/retryd/pkg/contract"
)

// Scenario 17: refused requests change nothing. Against the real
// services, 10,000 requests (in the short run too) spread over the operator, admin
// and intake routes of the scheduler, ingress and triggers, each with a
// credential that must not work: a random token, an expired token, a
// revoked token (both admin, and both used while valid first, so every
// service has them cached), and valid tokens of the wrong role (a producer
// on operator and admin routes, a viewer on every write, an operator on
// admin routes). Asserted: every one answers 401 (bad, expired, revoked)
// or 403 (wrong role), and nothing changed: retries by state, events by
// status, sources' pause state and limits, policies' and triggers'
// versions, tokens, outbox, audit_log, job operations, and the message
// counts of RETRIES, EVENTS and INGEST.

// s17Route is one route attacked, with a body that would change something
// if the request were served.
type s17Route struct {
	service, method, path string
	body                  func(i int) string
	need                  string // operator, admin or producer
}

// The refused callers; each is refused with the status of its class.
var s17Classes = []struct {
	name   string
	status int
	// targets reports whether a route's need is one the class attacks.
	targets func(need string) bool
}{
	{"bad", http.StatusUnauthorized, func(string) bool { return true }},
	{"expired", http.StatusUnauthorized, func(string) bool { return true }},
	{"revoked", http.StatusUnauthorized, func(string) bool { return true }},
	{"producer", http.StatusForbidden, func(need string) bool { return need != "producer" }},
	{"viewer", http.StatusForbidden, func(string) bool { return true }},
	{"operator", http.StatusForbidden, func(need string) bool { return need != "operator" }},
}

func TestScenario17RefusedRequestsChangeNothing(t *testing.T) {
	t.Parallel()
	s := setup(t, harness.Options{})
	r := &harness.Report{Scenario: "17 refused requests change nothing"}
	for _, name := range []string{harness.Scheduler, harness.Ingress, harness.Triggers} {
		s.Start(name)
	}
	sched, ingress, triggers := s.URL(harness.Scheduler), s.URL(harness.Ingress), s.URL(harness.Triggers)
	urls := map[string]string{harness.Scheduler: sched, harness.Ingress: ingress, harness.Triggers: triggers}

	// State to attack: pending retries, a rate-limited source, a paused
	// one holding deferred events, a policy, a trigger, tokens.
	s.Policy("authz", "", fastPolicy("authz", time.Hour, 3))
	ids, msgs := failedItems(t, "authz", "s17", 20, nil)
	if _, err := harness.PublishAll(s.Ctx, s.JS, msgs); err != nil {
		t.Fatalf("publish failures: %v", err)
	}
	s.MustDo(http.MethodPut, ingress+"/v1/sources/shop", map[string]any{"rate_limit": 100, "rate_window": "1s"}, http.StatusOK)
	s.MustDo(http.MethodPost, ingress+"/v1/sources/held/pause", map[string]any{"reason": "faults: scenario 17"}, http.StatusOK)
	sender := &harness.EventSender{Sys: s, URL: ingress}
	events := make([]map[string]any, 10)
	for i := range events {
		events[i] = map[string]any{"id": fmt.Sprintf("s17-held-%02d", i), "source": "held", "type": "order.created", "data": map[string]any{"n": i}}
	}
	if err := sender.SendAll(s.Ctx, events, 4); err != nil {
		t.Fatalf("send events: %v", err)
	}
	var trig struct {
		ID      string `json:"id"`
		Version int    `json:"version"`
	}
	s17JSON(t, s.MustDo(http.MethodPost, triggers+"/v1/triggers", map[string]any{
		"name": "s17", "source": "shop", "event_type": "order.paid", "workflow": "w",
	}, http.StatusCreated), &trig)

	tokens := map[string]string{}
	tokenIDs := map[string]string{}
	create := func(name, role string, expires *time.Time) {
		body := map[string]any{"name": name, "role": role}
		if expires != nil {
			body["expires_at"] = expires.UTC().Format(time.RFC3339Nano)
		}
		var c struct {
			ID    string `json:"id"`
			Token string `json:"token"`
		}
		s17JSON(t, s.MustDo(http.MethodPost, sched+"/v1/tokens", body, http.StatusCreated), &c)
		tokens[name], tokenIDs[name] = c.Token, c.ID
	}
	client := &http.Client{Transport: &http.Transport{MaxIdleConnsPerHost: 64}, Timeout: 30 * time.Second}
	t.Cleanup(client.CloseIdleConnections)
	send := func(ctx context.Context, method, url, token, body string) (int, error) {
		var rd io.Reader
		if body != "" {
			rd = strings.NewReader(body)
		}
		req, err := http.NewRequestWithContext(ctx, method, url, rd)
		if err != nil {
			return 0, err
		}
		if body != "" {
			req.Header.Set("Content-Type", "application/json")
		}
		req.Header.Set("Authorization", "Bearer "+token)
		resp, err := client.Do(req)
		if err != nil {
			return 0, err
		}
		_, _ = io.Copy(io.Discard, resp.Body)
		return resp.StatusCode, resp.Body.Close()
	}
	// everyService asks each service's index with token until want, and
	// fails after within.
	everyService := func(token string, want int, within time.Duration, what string) time.Duration {
		t.Helper()
		start := time.Now()
		for name, u := range urls {
			var code int
			if _, ok := harness.Eventually(s.Ctx, within, 50*time.Millisecond, func() bool {
				code, _ = send(s.Ctx, http.MethodGet, u+"/v1/", token, "")
				return code == want
			}); !ok {
				t.Fatalf("%s: %s answered %d for %s, want %d", what, name, code, within, want)
			}
		}
		return time.Since(start)
	}
	for _, role := range []string{"producer", "viewer", "operator"} {
		create(role, role, nil)
	}
	// An admin token that expires in 6 s and one that is revoked, each
	// used while valid, so every service's verifier caches it. The expiry
	// leaves the checks below time on a loaded machine, and mostly passes
	// while the revoke is waited out.
	expiry := time.Now().Add(6 * time.Second)
	create("expired", "admin", &expiry)
	create("revoked", "admin", nil)
	everyService(tokens["expired"], http.StatusOK, 10*time.Second, "expired token before its expiry")
	everyService(tokens["revoked"], http.StatusOK, 10*time.Second, "revoked token before revoking")
	s.MustDo(http.MethodDelete, sched+"/v1/tokens/"+tokenIDs["revoked"], nil, http.StatusOK)
	// A revoke reaches every service within the verifier's cache TTL (5 s
	// by default); an expiry at once.
	took := everyService(tokens["revoked"], http.StatusUnauthorized, 5*time.Second+5*time.Second, "revoked token")
	r.Note("revoked admin token refused by every service %s after the revoke (cache TTL 5 s)", took.Round(time.Millisecond))
	if _, ok := harness.Eventually(s.Ctx, 10*time.Second, 50*time.Millisecond, func() bool { return time.Now().After(expiry) }); !ok {
		t.Fatal("the expiry did not come")
	}
	everyService(tokens["expired"], http.StatusUnauthorized, time.Second, "expired token")

	if _, ok := harness.Eventually(s.Ctx, 30*time.Second, 100*time.Millisecond, func() bool {
		return states(s.Ctx, s.Pool, "authz")["scheduled"] == len(ids)
	}); !ok {
		t.Fatalf("retries not scheduled: %v", states(s.Ctx, s.Pool, "authz"))
	}
	before := s17Settle(t, s)
	r.Note("state before: %d figures compared", len(before))

	routes := s17Routes(ids, trig.ID, trig.Version, tokenIDs["viewer"])
	// 10,000 in both runs: refusals are cheap (about 10,000/s here), so
	// the scenario's time is its start-up and the revoke's cache TTL.
	n := 10_000
	type job struct {
		class  int
		route  s17Route
		token  string
		serial int
	}
	jobs := make(chan job)
	var mu sync.Mutex
	byClass := map[string]map[int]int{}
	var unexpected []string
	var served atomic.Int64
	var wg sync.WaitGroup
	start := time.Now()
	for range 16 {
		wg.Add(1)
		go func() {
			defer wg.Done()
			for j := range jobs {
				c := s17Classes[j.class]
				code, err := send(s.Ctx, j.route.method, urls[j.route.service]+j.route.path, j.token, j.route.body(j.serial))
				mu.Lock()
				if byClass[c.name] == nil {
					byClass[c.name] = map[int]int{}
				}
				byClass[c.name][code]++
				if code != c.status && len(unexpected) < 20 {
					unexpected = append(unexpected, fmt.Sprintf("%s %s %s as %s: %d %v", j.route.service, j.route.method, j.route.path, c.name, code, err))
				}
				mu.Unlock()
				if code < 400 {
					served.Add(1)
				}
			}
		}()
	}
	counts := make([]int, len(s17Classes))
	for i := range n {
		ci := i % len(s17Classes)
		c := s17Classes[ci]
		var eligible []s17Route
		for _, rt := range routes {
			if c.targets(rt.need) {
				eligible = append(eligible, rt)
			}
		}
		token := tokens[c.name]
		if c.name == "bad" {
			token = s17BadToken(i)
		}
		jobs <- job{class: ci, route: eligible[counts[ci]%len(eligible)], token: token, serial: i}
		counts[ci]++
	}
	close(jobs)
	wg.Wait()
	elapsed := time.Since(start)
	r.Sent = n
	r.Lost = int(served.Load())
	for _, c := range s17Classes {
		got := byClass[c.name]
		r.Note("%s: %v (want all %d)", c.name, got, c.status)
	}
	r.Note("%d requests over %d routes in %s (%.0f/s)", n, len(routes), elapsed.Round(time.Millisecond), float64(n)/elapsed.Seconds())
	if len(unexpected) > 0 {
		t.Errorf("requests not refused as their class must be (first %d):\n%s", len(unexpected), strings.Join(unexpected, "\n"))
	}

	// Nothing changed: right away, and after the services' relay and
	// reconcile intervals had a chance to publish anything a request
	// left behind.
	after := s17Snapshot(t, s)
	changed := s17Diff(before, after)
	watchUntil := time.Now().Add(2500 * time.Millisecond)
	harness.Eventually(s.Ctx, 10*time.Second, 250*time.Millisecond, func() bool {
		changed = append(changed, s17Diff(before, s17Snapshot(t, s))...)
		return time.Now().After(watchUntil)
	})
	// In the report's terms: lost is the number of requests served,
	// duplicate_effects the number of figures that changed.
	r.DuplicateEffects = len(changed)
	keys := slices.Sorted(maps.Keys(after))
	for _, k := range keys {
		r.Note("%s: %s", k, after[k])
	}
	r.Print(t)
	if len(changed) > 0 {
		slices.Sort(changed)
		t.Fatalf("refused requests changed state:\n%s", strings.Join(slices.Compact(changed), "\n"))
	}
}

// s17Routes lists the write routes attacked, on real targets, with bodies
// that would act if served.
func s17Routes(retryIDs []string, triggerID string, triggerVersion int, viewerTokenID string) []s17Route {
	static := func(b string) func(int) string { return func(int) string { return b } }
	none := static("")
	retry := func(i int) string { return retryIDs[i%len(retryIDs)] }
	trigger := fmt.Sprintf(`{"name":"hijacked","source":"shop","event_type":"order.paid","workflow":"evil","version":%d}`, triggerVersion)
	return []s17Route{
		// Operator routes.
		{harness.Scheduler, http.MethodPost, "/v1/retries/authz/" + retry(0) + "/cancel", static(`{"reason":"s17"}`), "operator"},
		{harness.Scheduler, http.MethodPost, "/v1/retries/authz/" + retry(1) + "/retry", static(`{"reason":"s17","reset_attempts":true}`), "operator"},
		{harness.Scheduler, http.MethodPost, "/v1/jobs/s17-job/retry", none, "operator"},
		{harness.Scheduler, http.MethodPost, "/v1/jobs/s17-job/cancel", none, "operator"},
		{harness.Scheduler, http.MethodPost, "/v1/jobs/bulk-retry", static(`{"filter":{},"dry_run":false}`), "operator"},
		{harness.Scheduler, http.MethodPost, "/v1/operations/op-s17/cancel", none, "operator"},
		{harness.Ingress, http.MethodPost, "/v1/sources/shop/pause", static(`{"reason":"s17"}`), "operator"},
		{harness.Ingress, http.MethodPost, "/v1/sources/held/resume", none, "operator"},
		{harness.Ingress, http.MethodPost, "/v1/events/s17-held-00/cancel", static(`{"reason":"s17"}`), "operator"},
		// Admin routes.
		{harness.Scheduler, http.MethodPut, "/v1/policies/authz/_", static(`{"name":"hijacked","max_retries":0,"base_delay_ms":1,"max_delay_ms":1}`), "admin"},
		{harness.Scheduler, http.MethodPost, "/v1/tokens", func(i int) string { return fmt.Sprintf(`{"name":"evil-%d","role":"admin"}`, i) }, "admin"},
		{harness.Scheduler, http.MethodDelete, "/v1/tokens/" + viewerTokenID, none, "admin"},
		{harness.Scheduler, http.MethodGet, "/v1/tokens", none, "admin"},
		{harness.Scheduler, http.MethodGet, "/v1/audit", none, "admin"},
		{harness.Ingress, http.MethodPut, "/v1/sources/shop", static(`{"rate_limit":1,"rate_window":"1h"}`), "admin"},
		{harness.Triggers, http.MethodPost, "/v1/triggers", static(`{"name":"evil","source":"shop","event_type":"order.paid","workflow":"evil"}`), "admin"},
		{harness.Triggers, http.MethodPut, "/v1/triggers/" + triggerID, static(trigger), "admin"},
		{harness.Triggers, http.MethodPost, "/v1/triggers/" + triggerID + "/disable", none, "admin"},
		{harness.Triggers, http.MethodDelete, "/v1/triggers/" + triggerID, none, "admin"},
		// Intake.
		{harness.Ingress, http.MethodPost, "/v1/events", func(i int) string {
			return fmt.Sprintf(`{"id":"s17-evil-%d","source":"shop","type":"order.paid","data":{}}`, i)
		}, "producer"},
		{harness.Ingress, http.MethodPost, "/v1/events:batch", func(i int) string {
			return fmt.Sprintf(`{"events":[{"id":"s17-evil-batch-%d","source":"shop","type":"order.paid","data":{}}]}`, i)
		}, "producer"},
	}
}

// badToken is a random credential: mostly well-formed tokens nobody
// issued, and some that are not tokens at all.
func s17BadToken(i int) string {
	b := make([]byte, 32)
	_, _ = rand.Read(b)
	switch i % 4 {
	case 0:
		return base64.RawURLEncoding.EncodeToString(b[:20]) // no prefix
	case 1:
		return "rtd_" + base64.RawURLEncoding.EncodeToString(b[:8]) // too short
	default:
		return "rtd_" + base64.RawURLEncoding.EncodeToString(b) // well-formed, unknown
	}
}

// s17Figures are the queries whose answers must not change; each answers
// one line of text.
var s17Figures = map[string]string{
	"retries by kind and state": `SELECT coalesce(string_agg(kind || '/' || state || '=' || n, ' ' ORDER BY kind, state), '')
		FROM (SELECT kind, state, count(*) n FROM retries GROUP BY 1, 2) x`,
	"events by status": `SELECT coalesce(string_agg(status || '=' || n, ' ' ORDER BY status), '')
		FROM (SELECT status, count(*) n FROM workflow_events GROUP BY 1) x`,
	"sources": `SELECT coalesce(string_agg(format('%s paused=%s until=%s limit=%s/%sms types=%s',
		source, paused, paused_until, rate_limit, rate_window_ms, allowed_types), ' ' ORDER BY source), '') FROM event_sources`,
	"policies": `SELECT string_agg(kind || '/' || job_type || '@' || version, ' ' ORDER BY kind, job_type) || ' versions=' ||
		(SELECT count(*) FROM retry_policy_versions) FROM retry_policies`,
	"triggers": `SELECT coalesce(string_agg(format('%s@%s enabled=%s deleted=%s', trigger_id, version, enabled, deleted_at IS NOT NULL), ' '
		ORDER BY trigger_id), '') || ' versions=' || (SELECT count(*) FROM workflow_trigger_versions) FROM workflow_triggers`,
	"tokens": `SELECT coalesce(string_agg(format('%s:%s:%s', name, role, CASE WHEN revoked_at IS NULL THEN 'live' ELSE 'revoked' END), ' '
		ORDER BY name, id), '') FROM api_tokens`,
	"outbox rows":    `SELECT count(*)::text FROM outbox`,
	"audit_log rows": `SELECT count(*)::text FROM audit_log`,
	"job operations": `SELECT count(*)::text FROM job_operations`,
}

// snapshot reads every figure and the message count of each stream.
func s17Snapshot(t *testing.T, s *harness.System) map[string]string {
	t.Helper()
	out := map[string]string{}
	for name, q := range s17Figures {
		var v string
		if err := s.Pool.QueryRow(s.Ctx, q).Scan(&v); err != nil {
			t.Fatalf("%s: %v", name, err)
		}
		out[name] = v
	}
	for _, name := range []string{contract.StreamRetries, contract.StreamEvents, contract.StreamIngest} {
		st, err := s.JS.Stream(s.Ctx, name)
		if err != nil {
			t.Fatalf("stream %s: %v", name, err)
		}
		info, err := st.Info(s.Ctx)
		if err != nil {
			t.Fatalf("stream %s: %v", name, err)
		}
		out["stream "+name+" messages"] = fmt.Sprint(info.State.Msgs)
	}
	return out
}

// settle waits until the set-up's effects are done (the outbox relayed,
// the deferrals recorded): two snapshots a second apart agree.
func s17Settle(t *testing.T, s *harness.System) map[string]string {
	t.Helper()
	prev := s17Snapshot(t, s)
	var cur map[string]string
	if _, ok := harness.Eventually(s.Ctx, 30*time.Second, time.Second, func() bool {
		cur = s17Snapshot(t, s)
		same := maps.Equal(prev, cur) && cur["outbox rows"] == "0"
		prev = cur
		return same
	}); !ok {
		t.Fatalf("the set-up did not settle in 30 s: %v", cur)
	}
	return cur
}

func s17Diff(before, after map[string]string) []string {
	var out []string
	for k, v := range before {
		if after[k] != v {
			out = append(out, fmt.Sprintf("%s: before %q, after %q", k, v, after[k]))
		}
	}
	return out
}

func s17JSON(t *testing.T, raw []byte, v any) {
	t.Helper()
	if err := json.Unmarshal(raw, v); err != nil {
		t.Fatalf("decode %s: %v", raw, err)
	}
}
