package main

import (
	"context"
	"encoding/json"
	"fmt"
	"net/http"
	"net/http/httptest"
	"net/url"
	"slices"
	"testing"
	"time"

	"github.com/jackc/pgx/v5/pgxpool"
	"github.com/nats-io/nats.go/jetstream"
	"github.com/prometheus/client_golang/prometheus"
	"github.com/stretchr/testify/require"

	"github.com/retryd/retryd/internal/auth"
	"github.com/retryd/retryd/internal/backendtest"
	"github.com/retryd/retryd/internal/dashboard"
	"github.com/retryd/retryd/internal/serve"
	"github.com/retryd/retryd/internal/streams"
	"github.com/retryd/retryd/migrations/pgtest"
	"github.com/retryd/retryd/pkg/contract"
	schedulersvc "github.com/retryd/retryd/services/scheduler"
	"github.com/retryd/retryd/stores/pgdb"
	"github.com/retryd/retryd/stores/retrystore"
)

const shardAdminToken = "rtd_gatewayshardsadmintoken0123456789abcdef"

// shardedStack is two real scheduler shards, each with its own database,
// on one NATS server whose RETRIES is split in two, and a gateway in
// front of them.
type shardedStack struct {
	t      *testing.T
	be     backendtest.Backends
	pools  []*pgxpool.Pool
	urls   []*url.URL
	gw     string
	authed auth.Config
	// ids are the items failed on each shard; legacy is an item failed
	// before the split: it sits on shard 0 though its shard is now 1.
	ids    [2][]string
	legacy string
}

func startShardedStack(t *testing.T) *shardedStack {
	t.Helper()
	be := backendtest.Start(t, 3*time.Minute)
	s := &shardedStack{t: t, be: be, pools: []*pgxpool.Pool{be.Pool, pgtest.NewPool(t)},
		authed: auth.Config{Mode: auth.ModeTokens, AdminToken: shardAdminToken}}
	opts := streams.Options{Storage: jetstream.MemoryStorage}
	require.NoError(t, streams.Ensure(be.Ctx, be.JS, opts))
	for i := 0; s.legacy == "" || len(s.ids[0]) < 4 || len(s.ids[1]) < 4; i++ {
		id := fmt.Sprintf("01GWSHARD%03d", i)
		switch k := contract.Shard(contract.KindJob, id, 2); {
		case s.legacy == "" && k == 1:
			s.legacy = id
			s.fail(id) // stored unsplit: shard 0 takes it
		case len(s.ids[k]) < 4:
			s.ids[k] = append(s.ids[k], id)
		}
	}
	opts.Shards = 2
	require.NoError(t, streams.Ensure(be.Ctx, be.JS, opts))

	for k, pool := range s.pools {
		sched, err := schedulersvc.New(schedulersvc.Config{Pool: pool, JS: be.JS, Logger: testLogger(t), Registerer: prometheus.NewRegistry(),
			MaxIdle: 200 * time.Millisecond, Shards: 2, Shard: k, Streams: opts})
		require.NoError(t, err)
		require.NoError(t, sched.Start(be.Ctx))
		t.Cleanup(func() {
			ctx, cancel := context.WithTimeout(context.Background(), 20*time.Second)
			defer cancel()
			require.NoError(t, sched.Stop(ctx))
		})
		// Every shard checks tokens in the home shard's database, as
		// RETRYD_AUTH_DATABASE_URL has retryd-scheduler do.
		guard, tokens, err := s.authed.Guard(be.Ctx, s.pools[0], testLogger(t), "127.0.0.1:0")
		require.NoError(t, err)
		mux := http.NewServeMux()
		mux.Handle("/v1/", sched.Handler())
		auth.NewAPI(tokens).Register(mux)
		srv := httptest.NewServer(guard.Handler(mux))
		t.Cleanup(srv.Close)
		u, err := url.Parse(srv.URL)
		require.NoError(t, err)
		s.urls = append(s.urls, u)
	}
	s.gw = s.gateway(s.urls)
	for k, ids := range s.ids {
		for _, id := range ids {
			s.fail(id)
			s.waitRow(k, id, retrystore.StateScheduled)
		}
	}
	s.waitRow(0, s.legacy, retrystore.StateScheduled)
	return s
}

// gateway starts a gateway in front of the scheduler shards at urls, as
// `retryd gateway` builds it, and returns its URL.
func (s *shardedStack) gateway(urls []*url.URL) string {
	s.t.Helper()
	down, err := url.Parse("http://127.0.0.1:1")
	require.NoError(s.t, err)
	guard, _, err := s.authed.Guard(s.be.Ctx, s.pools[0], testLogger(s.t), "127.0.0.1:0")
	require.NoError(s.t, err)
	health := &serve.Health{}
	health.SetReady(true)
	h := gatewayHandler(upstreams{scheduler: urls[0], schedulers: urls, ingress: down, triggers: down, jobs: urls[0]}, nil,
		func(ctx context.Context) (dashboard.Summary, error) { return shardsSummary(ctx, s.pools) },
		prometheus.NewRegistry(), health, testLogger(s.t))
	gw := httptest.NewServer(guard.Handler(h))
	s.t.Cleanup(gw.Close)
	return gw.URL
}

func (s *shardedStack) fail(id string) {
	s.t.Helper()
	msg, err := contract.NewLifecycleMsg("test/owner", contract.Failed, contract.FailedData{Kind: contract.KindJob, ID: id, Attempt: 1,
		JobType: "gw_shards", Error: contract.ErrorInfo{Class: "network", Message: "connection reset"}}, time.Now())
	require.NoError(s.t, err)
	_, err = s.be.JS.PublishMsg(s.be.Ctx, msg)
	require.NoError(s.t, err)
}

func (s *shardedStack) waitRow(shard int, id string, state retrystore.State) {
	s.t.Helper()
	require.Eventually(s.t, func() bool {
		r, err := retrystore.Get(s.be.Ctx, s.pools[shard], contract.KindJob, id)
		return err == nil && r.State == state
	}, 30*time.Second, 10*time.Millisecond, "job %s %s on shard %d", id, state, shard)
}

type listPage struct {
	Retries []struct {
		Kind string `json:"kind"`
		ID   string `json:"id"`
	} `json:"retries"`
	NextCursor *string `json:"next_cursor"`
}

// The gateway finds an item on its shard, or on the shard it had before
// the split; lists every shard as one list, in a scheduler's order,
// page by page; and sends manual actions to the item's shard.
func TestGatewayShardsFindListAndAct(t *testing.T) {
	t.Parallel()
	s := startShardedStack(t)

	code, _ := call(t, http.MethodGet, s.urls[1].String()+"/v1/retries/job/"+s.legacy, shardAdminToken, "")
	require.Equal(t, http.StatusNotFound, code, "the legacy item is not on the shard it has now")
	for _, id := range append(slices.Concat(s.ids[0], s.ids[1]), s.legacy) {
		code, body := call(t, http.MethodGet, s.gw+"/v1/retries/job/"+id, shardAdminToken, "")
		require.Equal(t, http.StatusOK, code, body)
		require.Contains(t, body, `"id":"`+id+`"`)
	}
	code, body := call(t, http.MethodGet, s.gw+"/v1/retries/job/01GWNOWHERE", shardAdminToken, "")
	require.Equal(t, http.StatusNotFound, code)
	require.Contains(t, body, `"code":"not_found"`)

	// Paged across both shards: every item once, in kind and id order.
	want := append(slices.Concat(s.ids[0], s.ids[1]), s.legacy)
	slices.Sort(want)
	var got []string
	pages := 0
	for cursor := ""; ; {
		pages++
		code, body := call(t, http.MethodGet, s.gw+"/v1/retries?kind=job&job_type=gw_shards&limit=4&cursor="+cursor, shardAdminToken, "")
		require.Equal(t, http.StatusOK, code, body)
		var p listPage
		require.NoError(t, json.Unmarshal([]byte(body), &p))
		require.LessOrEqual(t, len(p.Retries), 4)
		for _, r := range p.Retries {
			got = append(got, r.ID)
		}
		if p.NextCursor == nil {
			break
		}
		cursor = *p.NextCursor
	}
	require.Equal(t, want, got)
	require.Equal(t, 3, pages, "9 items, 4 a page")
	code, body = call(t, http.MethodGet, s.gw+"/v1/retries?kind=job", shardAdminToken, "")
	require.Equal(t, http.StatusOK, code)
	var all listPage
	require.NoError(t, json.Unmarshal([]byte(body), &all))
	require.Len(t, all.Retries, len(want))
	require.Nil(t, all.NextCursor, "one page holds everything: no cursor, as a scheduler answers")

	// The dashboard counts both shards.
	code, body = call(t, http.MethodGet, s.gw+"/ui/api/summary", shardAdminToken, "")
	require.Equal(t, http.StatusOK, code, body)
	var sum dashboard.Summary
	require.NoError(t, json.Unmarshal([]byte(body), &sum))
	total := int64(0)
	for _, c := range sum.Counts {
		if c.Kind == contract.KindJob {
			total += c.Count
		}
	}
	require.Equal(t, int64(len(want)), total)

	// A token created through the gateway (on the home shard) acts on
	// either shard.
	code, body = call(t, http.MethodPost, s.gw+"/v1/tokens", shardAdminToken, `{"name":"ops","role":"operator"}`)
	require.Equal(t, http.StatusCreated, code, body)
	var created struct {
		Token string `json:"token"`
	}
	require.NoError(t, json.Unmarshal([]byte(body), &created))

	onOne, onZero := s.ids[1][0], s.ids[0][0]
	code, body = call(t, http.MethodPost, s.gw+"/v1/retries/job/"+onOne+"/cancel", created.Token, `{"reason":"gateway test"}`)
	require.Equal(t, http.StatusOK, code, body)
	s.waitRow(1, onOne, retrystore.StateCancelled)
	code, body = call(t, http.MethodPost, s.gw+"/v1/retries/job/"+s.legacy+"/cancel", created.Token, `{"reason":"still on its old shard"}`)
	require.Equal(t, http.StatusOK, code, body)
	s.waitRow(0, s.legacy, retrystore.StateCancelled)
	code, body = call(t, http.MethodPost, s.gw+"/v1/retries/job/"+onZero+"/retry", created.Token, `{"reason":"now"}`)
	require.Equal(t, http.StatusOK, code, body)
	require.Contains(t, body, `"id":"`+onZero+`"`)
	_, err := retrystore.Get(s.be.Ctx, s.pools[1], contract.KindJob, onZero)
	require.ErrorIs(t, err, pgdb.ErrNotFound, "shard 1 never saw it")
	// Its cancellation went to its shard now: it is on both shards until
	// the split moves it, and the list shows it once.
	s.waitRow(1, s.legacy, retrystore.StateCancelled)
	code, body = call(t, http.MethodGet, s.gw+"/v1/retries?kind=job&limit=1000", shardAdminToken, "")
	require.Equal(t, http.StatusOK, code)
	all = listPage{}
	require.NoError(t, json.Unmarshal([]byte(body), &all))
	got = got[:0]
	for _, r := range all.Retries {
		got = append(got, r.ID)
	}
	require.Equal(t, want, got)

}

// Malformed input is refused as one scheduler refuses it.
func TestGatewayShardsRefuseMalformed(t *testing.T) {
	t.Parallel()
	s := startShardedStack(t)
	for _, tc := range []struct{ path, field string }{
		{"/v1/retries?cursor=not-a-cursor", "cursor"},
		{"/v1/retries?cursor=" + encodeShardCursor([]string{"", "", ""}), "cursor"},
		{"/v1/retries?cursor=" + encodeShardCursor([]string{shardDone, shardDone}), "cursor"},
		{"/v1/retries?cursor=" + encodeShardCursor([]string{"x", ""}), "cursor"},
		{"/v1/retries?limit=0", "limit"},
		{"/v1/retries?kind=Not_A_Kind", "kind"},
		{"/v1/retries?colour=red", "colour"},
		{"/v1/retries/Not%20A%20Kind/01J", "kind"},
		{"/v1/retries/job/bad.id", "id"},
	} {
		code, body := call(t, http.MethodGet, s.gw+tc.path, shardAdminToken, "")
		require.Equal(t, http.StatusBadRequest, code, tc.path)
		var e serve.ErrorBody
		require.NoError(t, json.Unmarshal([]byte(body), &e), tc.path)
		require.Equal(t, serve.CodeInvalidInput, e.Error.Code, tc.path)
		require.Equal(t, tc.field, e.Error.Field, tc.path)
	}
	code, _ := call(t, http.MethodGet, s.gw+"/v1/retries", "rtd_notatokenatallnotatokenatall0000", "")
	require.Equal(t, http.StatusUnauthorized, code)
}

// A policy is written to every shard; shard 0 checks "version" and
// refuses before any shard changes.
func TestGatewayShardsPolicies(t *testing.T) {
	t.Parallel()
	s := startShardedStack(t)
	put := func(body string) (int, string) {
		return call(t, http.MethodPut, s.gw+"/v1/policies/job/gw_shards", shardAdminToken, body)
	}
	versions := func() []int {
		var out []int
		for _, pool := range s.pools {
			p, err := retrystore.GetPolicy(s.be.Ctx, pool, contract.KindJob, "gw_shards")
			require.NoError(t, err)
			out = append(out, p.Version)
		}
		return out
	}
	code, body := put(`{"max_retries":5,"base_delay_ms":1000,"max_delay_ms":60000,"name":"gw"}`)
	require.Equal(t, http.StatusCreated, code, body)
	require.Equal(t, []int{1, 1}, versions())
	code, body = put(`{"max_retries":6,"base_delay_ms":1000,"max_delay_ms":60000,"name":"gw","version":1}`)
	require.Equal(t, http.StatusOK, code, body)
	require.Contains(t, body, `"version":2`)
	require.Equal(t, []int{2, 2}, versions())
	code, _ = put(`{"max_retries":7,"base_delay_ms":1000,"max_delay_ms":60000,"name":"gw","version":1}`)
	require.Equal(t, http.StatusConflict, code)
	code, _ = put(`{"max_retries":-1,"base_delay_ms":1000,"max_delay_ms":60000,"name":"gw"}`)
	require.Equal(t, http.StatusBadRequest, code)
	require.Equal(t, []int{2, 2}, versions(), "a refusal changes no shard")
	p, err := retrystore.GetPolicy(s.be.Ctx, s.pools[1], contract.KindJob, "gw_shards")
	require.NoError(t, err)
	require.Equal(t, 6, p.MaxRetries)
	code, body = call(t, http.MethodGet, s.gw+"/v1/policies/job/gw_shards", shardAdminToken, "")
	require.Equal(t, http.StatusOK, code)
	require.Contains(t, body, `"max_retries":6`)
}

// A shard that cannot be reached is named in a 502; what does not need
// it keeps working, and a policy written meanwhile says to PUT it again.
func TestGatewayShardsUnreachable(t *testing.T) {
	t.Parallel()
	s := startShardedStack(t)
	down, err := url.Parse("http://127.0.0.1:1")
	require.NoError(t, err)
	gw := s.gateway([]*url.URL{s.urls[0], down})

	code, body := call(t, http.MethodGet, gw+"/v1/retries/job/"+s.ids[0][0], shardAdminToken, "")
	require.Equal(t, http.StatusOK, code, body)
	for _, path := range []string{"/v1/retries/job/" + s.ids[1][0], "/v1/retries/job/" + s.legacy, "/v1/retries"} {
		code, body := call(t, http.MethodGet, gw+path, shardAdminToken, "")
		require.Equal(t, http.StatusBadGateway, code, path)
		require.Contains(t, body, `"code":"bad_gateway"`, path)
		require.Contains(t, body, "scheduler shard 1", path)
	}
	code, body = call(t, http.MethodPut, gw+"/v1/policies/job/gw_down", shardAdminToken, `{"max_retries":5,"base_delay_ms":1000,"max_delay_ms":60000,"name":"gw"}`)
	require.Equal(t, http.StatusBadGateway, code)
	require.Contains(t, body, "not on shard 1 (unreachable)")
	require.Contains(t, body, "PUT the same policy again")
	_, err = retrystore.GetPolicy(s.be.Ctx, s.pools[0], contract.KindJob, "gw_down")
	require.NoError(t, err, "shard 0 took it")

	// Repeated once the shard is back, it reaches every shard.
	code, body = call(t, http.MethodPut, s.gw+"/v1/policies/job/gw_down", shardAdminToken, `{"max_retries":5,"base_delay_ms":1000,"max_delay_ms":60000,"name":"gw"}`)
	require.Equal(t, http.StatusOK, code, body)
	for k, pool := range s.pools {
		p, err := retrystore.GetPolicy(s.be.Ctx, pool, contract.KindJob, "gw_down")
		require.NoError(t, err, "shard %d", k)
		require.Equal(t, 5, p.MaxRetries)
	}
}

// The shards' URLs and databases are refused before the gateway listens
// when they do not pair up.
func TestGatewayShardFlagsRefused(t *testing.T) {
	t.Parallel()
	for _, tc := range []usageCase{
		{[]string{"gateway", "--listen", "127.0.0.1:0", "--scheduler", "http://s0:8080,scheduler-1", "--database-url", "postgres://127.0.0.1:1/a"},
			`--scheduler "scheduler-1" (shard 1) is not an http(s) URL`},
		{[]string{"gateway", "--listen", "127.0.0.1:0", "--scheduler", "http://s0:8080", "--scheduler", "http://s1:8080", "--database-url", "postgres://127.0.0.1:1/a"},
			"--database-url is given 1 times for 2 --scheduler shards"},
	} {
		r := cli(t, tc.args...)
		require.Equal(t, exitUsage, r.code, "%v: %s", tc.args, r.stderr)
		require.Contains(t, r.stderr, tc.want, tc.args)
	}
}

// A shard answering an error it made (not the caller's) is named: the
// list is a 502 saying which shard answered what, and an item's own
// shard's answer other than a 404 is relayed as it is.
func TestGatewayShardsUpstreamErrors(t *testing.T) {
	t.Parallel()
	var urls []*url.URL
	for k := range 2 {
		srv := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
			if k == 0 {
				serve.WriteJSON(w, http.StatusOK, map[string]any{"retries": []any{}})
				return
			}
			serve.WriteJSON(w, http.StatusServiceUnavailable, serve.ErrorBody{Error: serve.ErrorDetail{Code: serve.CodeUnavailable, Message: "database is down"}})
		}))
		t.Cleanup(srv.Close)
		u, err := url.Parse(srv.URL)
		require.NoError(t, err)
		urls = append(urls, u)
	}
	health := &serve.Health{}
	gw := httptest.NewServer(serve.Guard{}.Handler(gatewayHandler(upstreams{scheduler: urls[0], schedulers: urls, ingress: urls[0], triggers: urls[0], jobs: urls[0]},
		nil, nil, prometheus.NewRegistry(), health, testLogger(t))))
	t.Cleanup(gw.Close)

	code, body := call(t, http.MethodGet, gw.URL+"/v1/retries", "", "")
	require.Equal(t, http.StatusBadGateway, code)
	require.Contains(t, body, "scheduler shard 1 answered the list with HTTP 503 unavailable")
	id := ""
	for i := 0; id == ""; i++ {
		if c := fmt.Sprintf("01J%d", i); contract.Shard(contract.KindJob, c, 2) == 1 {
			id = c
		}
	}
	code, _ = call(t, http.MethodGet, gw.URL+"/v1/retries/job/"+id, "", "")
	require.Equal(t, http.StatusServiceUnavailable, code)
	code, body = call(t, http.MethodPut, gw.URL+"/v1/policies/job/x", "", `{}`)
	require.Equal(t, http.StatusBadGateway, code)
	require.Contains(t, body, "not on shard 1 (HTTP 503 unavailable")
}
