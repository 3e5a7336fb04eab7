package serve_test

import (
	"bytes"
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"net"
	"net/http"
	"net/http/httptest"
	"strings"
	"sync/atomic"
	"testing"
	"time"

	"github.com/nats-io/nats.go/jetstream"
	"github.com/prometheus/client_golang/prometheus"
	"github.com/rs/zerolog"
	"github.com/stretchr/testify/require"

	"github.com/retryd/retryd/internal/serve"
	"github.com/retryd/retryd/pkg/contract"
	"github.com/retryd/retryd/stores/pgdb"
)

func get(t *testing.T, h http.Handler, path string) (int, string) {
	t.Helper()
	rec := httptest.NewRecorder()
	// A loopback Host: a Guard with authentication off serves no other.
	h.ServeHTTP(rec, httptest.NewRequest(http.MethodGet, "http://127.0.0.1"+path, nil))
	return rec.Code, rec.Body.String()
}

func TestMuxHealthReadyMetrics(t *testing.T) {
	t.Parallel()
	reg := prometheus.NewRegistry()
	c := prometheus.NewCounter(prometheus.CounterOpts{Namespace: "retryd", Subsystem: "test", Name: "hits_total", Help: "hits"})
	reg.MustRegister(c)
	c.Add(3)
	var health serve.Health
	mux := serve.NewMux(reg, &health)

	code, body := get(t, mux, "/healthz")
	require.Equal(t, http.StatusOK, code)
	require.JSONEq(t, `{"status":"ok"}`, body)

	code, body = get(t, mux, "/readyz")
	require.Equal(t, http.StatusServiceUnavailable, code)
	require.JSONEq(t, `{"status":"not_ready"}`, body)

	health.SetReady(true)
	require.True(t, health.Ready())
	code, body = get(t, mux, "/readyz")
	require.Equal(t, http.StatusOK, code)
	require.JSONEq(t, `{"status":"ready"}`, body)

	health.SetReady(false)
	code, _ = get(t, mux, "/readyz")
	require.Equal(t, http.StatusServiceUnavailable, code)

	// Liveness does not depend on readiness.
	code, _ = get(t, mux, "/healthz")
	require.Equal(t, http.StatusOK, code)

	code, body = get(t, mux, "/metrics")
	require.Equal(t, http.StatusOK, code)
	require.Contains(t, body, "retryd_test_hits_total 3")
}

func TestMuxAcceptsServiceRoutes(t *testing.T) {
	t.Parallel()
	mux := serve.NewMux(nil, nil)
	mux.HandleFunc("GET /v1/things/{id}", func(w http.ResponseWriter, r *http.Request) {
		serve.WriteJSON(w, http.StatusOK, map[string]string{"id": r.PathValue("id")})
	})
	code, body := get(t, mux, "/v1/things/abc")
	require.Equal(t, http.StatusOK, code)
	require.JSONEq(t, `{"id":"abc"}`, body)
	code, _ = get(t, mux, "/readyz")
	require.Equal(t, http.StatusServiceUnavailable, code, "nil Health is never ready")
	code, _ = get(t, mux, "/metrics")
	require.Equal(t, http.StatusOK, code)
}

func TestWriteErrorMapping(t *testing.T) {
	t.Parallel()
	_, decodeErr := contract.DecodeProducerEvent([]byte(`{"source":"shop","type":"Bad Type"}`))
	require.Error(t, decodeErr)
	_, tooBig := contract.DecodeProducerEvent(bytes.Repeat([]byte(" "), contract.MaxEnvelopeBytes+1))
	require.Error(t, tooBig)

	tests := []struct {
		name    string
		err     error
		status  int
		code    string
		field   string
		message string
	}{
		{"contract invalid", fmt.Errorf("decode event: %w", decodeErr), 400, "invalid_input", "type", "type"},
		{"contract too large", tooBig, 413, "too_large", "event", "limit"},
		{"max bytes", &http.MaxBytesError{Limit: 10}, 413, "too_large", "body", "too large"},
		{"bare invalid", contract.ErrInvalid, 400, "invalid_input", "", "invalid input"},
		{"not found", fmt.Errorf("retry event/abc: %w", pgdb.ErrNotFound), 404, "not_found", "", "retry event/abc: not found"},
		{"conflict", fmt.Errorf("retry is pending: %w", pgdb.ErrConflict), 409, "conflict", "", "retry is pending: conflict"},
		{"internal hidden", errors.New("pq: password authentication failed for user x"), 500, "internal", "", "internal error"},
		{"stream full", fmt.Errorf("publish job j1: nats: %w", &jetstream.APIError{Code: 503, ErrorCode: 10077, Description: "maximum bytes exceeded"}),
			503, "unavailable", "", "a stream is full"},
		{"storage full", fmt.Errorf("publish: %w", &jetstream.APIError{Code: 503, ErrorCode: 10023, Description: "insufficient resources"}),
			503, "unavailable", "", "nothing was stored"},
		{"other store failure hidden", &jetstream.APIError{Code: 503, ErrorCode: 10077, Description: "message too large"}, 500, "internal", "", "internal error"},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			t.Parallel()
			rec := httptest.NewRecorder()
			serve.WriteError(rec, tc.err)
			require.Equal(t, tc.status, rec.Code)
			require.Equal(t, "application/json", rec.Header().Get("Content-Type"))
			if tc.status == http.StatusServiceUnavailable {
				require.Equal(t, serve.RetryAfterFull, rec.Header().Get("Retry-After"))
			} else {
				require.Empty(t, rec.Header().Get("Retry-After"))
			}
			var body serve.ErrorBody
			dec := json.NewDecoder(rec.Body)
			dec.DisallowUnknownFields()
			require.NoError(t, dec.Decode(&body))
			require.Equal(t, tc.code, body.Error.Code)
			require.Equal(t, tc.field, body.Error.Field)
			require.Contains(t, body.Error.Message, tc.message)
		})
	}
}

// Reply answers 200 with the value, or the error as WriteError does.
func TestReply(t *testing.T) {
	t.Parallel()
	rec := httptest.NewRecorder()
	serve.Reply(rec, map[string]int{"n": 1}, nil)
	require.Equal(t, http.StatusOK, rec.Code)
	require.JSONEq(t, `{"n":1}`, rec.Body.String())
	rec = httptest.NewRecorder()
	serve.Reply(rec, map[string]int{"n": 1}, fmt.Errorf("thing t1: %w", pgdb.ErrNotFound))
	require.Equal(t, http.StatusNotFound, rec.Code)
	require.NotContains(t, rec.Body.String(), `"n"`)
}

// ReplyPage turns the store's bad-cursor error into a 400 naming the
// cursor, and answers anything else as Reply does.
func TestReplyPage(t *testing.T) {
	t.Parallel()
	rec := httptest.NewRecorder()
	serve.ReplyPage(rec, nil, fmt.Errorf("list things: %w", pgdb.ErrBadCursor))
	require.Equal(t, http.StatusBadRequest, rec.Code)
	var body serve.ErrorBody
	require.NoError(t, json.Unmarshal(rec.Body.Bytes(), &body))
	require.Equal(t, serve.ErrorDetail{Code: serve.CodeInvalidInput, Field: "cursor", Message: "cursor is not a cursor returned by this API"}, body.Error)

	rec = httptest.NewRecorder()
	serve.ReplyPage(rec, map[string]int{"n": 1}, nil)
	require.Equal(t, http.StatusOK, rec.Code)
	require.JSONEq(t, `{"n":1}`, rec.Body.String())
}

// WriteErrorLog answers as WriteError does and logs only the server's own
// failures, with the request's method and path.
func TestWriteErrorLog(t *testing.T) {
	t.Parallel()
	var logs bytes.Buffer
	log := zerolog.New(&logs)
	r := httptest.NewRequest(http.MethodGet, "/v1/things/t1", nil)

	rec := httptest.NewRecorder()
	serve.WriteErrorLog(rec, r, log, fmt.Errorf("thing t1: %w", pgdb.ErrNotFound))
	require.Equal(t, http.StatusNotFound, rec.Code)
	require.Empty(t, logs.String())

	rec = httptest.NewRecorder()
	serve.WriteErrorLog(rec, r, log, errors.New("connection refused"))
	require.Equal(t, http.StatusInternalServerError, rec.Code)
	require.NotContains(t, rec.Body.String(), "connection refused")
	require.Contains(t, logs.String(), `"error":"connection refused"`)
	require.Contains(t, logs.String(), `"method":"GET","path":"/v1/things/t1"`)
}

type request struct {
	Name  string           `json:"name"`
	Count int              `json:"count"`
	When  time.Time        `json:"when"`
	Inner *struct{ A int } `json:"inner"`
}

func decode(body string, limit int64) (request, error) {
	var v request
	r := httptest.NewRequest(http.MethodPost, "/", strings.NewReader(body))
	r.Header.Set("Content-Type", "application/json")
	err := serve.DecodeJSON(r, limit, &v)
	return v, err
}

func TestDecodeJSON(t *testing.T) {
	t.Parallel()
	v, err := decode(`{"name":"a","count":2}`+"\n", 1024)
	require.NoError(t, err)
	require.Equal(t, "a", v.Name)
	require.Equal(t, 2, v.Count)

	deep := strings.Repeat("[", 10_000) + strings.Repeat("]", 10_000)
	tests := []struct {
		name   string
		body   string
		limit  int64
		target error
		field  string
		reason string
	}{
		{"empty", "", 1024, contract.ErrInvalid, "body", "empty"},
		{"blank", "  \n", 1024, contract.ErrInvalid, "body", "empty"},
		{"unknown field", `{"name":"a","nmae":"b"}`, 1024, contract.ErrInvalid, "nmae", "not a known field"},
		{"wrong type", `{"count":"two"}`, 1024, contract.ErrInvalid, "count", "integer"},
		{"wrong nested type", `{"inner":{"A":"x"}}`, 1024, contract.ErrInvalid, "inner.A", "integer"},
		{"not an object", `[1,2]`, 1024, contract.ErrInvalid, "body", "object"},
		{"truncated", `{"name":"a"`, 1024, contract.ErrInvalid, "body", "truncated"},
		{"syntax", `{"name":}`, 1024, contract.ErrInvalid, "body", "not valid JSON"},
		{"trailing data", `{"name":"a"} {"name":"b"}`, 1024, contract.ErrInvalid, "body", "data after"},
		{"trailing garbage", `{"name":"a"}x`, 1024, contract.ErrInvalid, "body", "data after"},
		{"bad time", `{"when":"yesterday"}`, 1024, contract.ErrInvalid, "body", "yesterday"},
		{"invalid utf8", "{\"name\":\"\xff\xfe\"}", 1024, contract.ErrInvalid, "body", "UTF-8"},
		{"huge number", `{"count":1e400}`, 1024, contract.ErrInvalid, "count", "integer"},
		{"too deep", deep, 1 << 20, contract.ErrInvalid, "body", "nested deeper than 32"},
		{"deep in a string is fine for the scan", `{"name":"[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[\"[[["}x`, 1024, contract.ErrInvalid, "body", "data after"},
		{"too large", `{"name":"` + strings.Repeat("a", 2000) + `"}`, 1024, contract.ErrTooLarge, "body", "limit of 1024"},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			t.Parallel()
			_, err := decode(tc.body, tc.limit)
			require.ErrorIs(t, err, tc.target)
			var fe *contract.FieldError
			require.ErrorAs(t, err, &fe)
			require.Equal(t, tc.field, fe.Field)
			require.Contains(t, err.Error(), tc.reason)

			rec := httptest.NewRecorder()
			serve.WriteError(rec, err)
			want := http.StatusBadRequest
			if tc.target == contract.ErrTooLarge {
				want = http.StatusRequestEntityTooLarge
			}
			require.Equal(t, want, rec.Code)
		})
	}
}

func TestDecodeJSONNilBody(t *testing.T) {
	t.Parallel()
	r := httptest.NewRequest(http.MethodPost, "/", nil)
	r.Header.Set("Content-Type", "application/json")
	r.Body = nil
	var v request
	require.ErrorIs(t, serve.DecodeJSON(r, 10, &v), contract.ErrInvalid)
}

// An action's body may be left out; one that is sent is decoded as strictly
// as any other.
func TestDecodeOptionalJSON(t *testing.T) {
	t.Parallel()
	r := httptest.NewRequest(http.MethodPost, "/", nil)
	v := request{Name: "kept"}
	require.NoError(t, serve.DecodeOptionalJSON(r, 10, &v))
	require.Equal(t, "kept", v.Name)

	r = httptest.NewRequest(http.MethodPost, "/", strings.NewReader(`{"name":"b","extra":1}`))
	r.Header.Set("Content-Type", "application/json")
	require.ErrorIs(t, serve.DecodeOptionalJSON(r, 1024, &v), contract.ErrInvalid)
}

func TestServeGracefulShutdown(t *testing.T) {
	t.Parallel()
	started := make(chan struct{})
	release := make(chan struct{})
	mux := serve.NewMux(nil, nil)
	mux.HandleFunc("GET /slow", func(w http.ResponseWriter, _ *http.Request) {
		close(started)
		<-release
		serve.WriteJSON(w, http.StatusOK, map[string]string{"done": "yes"})
	})
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	require.NoError(t, err)
	srv := &http.Server{Handler: mux, ReadHeaderTimeout: 5 * time.Second}
	ctx, cancel := context.WithCancel(context.Background())
	done := make(chan error, 1)
	go func() { done <- serve.Serve(ctx, srv, ln, zerolog.Nop()) }()

	url := "http://" + ln.Addr().String()
	respc := make(chan *http.Response, 1)
	go func() {
		resp, err := http.Get(url + "/slow")
		if err != nil {
			respc <- nil
			return
		}
		respc <- resp
	}()
	<-started
	cancel() // shutdown begins while /slow is in flight

	// New connections are refused once shutdown started.
	require.Eventually(t, func() bool {
		_, err := net.Dial("tcp", ln.Addr().String())
		return err != nil
	}, 5*time.Second, 10*time.Millisecond)

	close(release)
	resp := <-respc
	require.NotNil(t, resp, "in-flight request must complete")
	b, _ := io.ReadAll(resp.Body)
	_ = resp.Body.Close()
	require.Equal(t, http.StatusOK, resp.StatusCode)
	require.JSONEq(t, `{"done":"yes"}`, string(b))
	require.NoError(t, <-done)
}

func TestRunListenError(t *testing.T) {
	t.Parallel()
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	require.NoError(t, err)
	defer ln.Close()
	srv := &http.Server{Addr: ln.Addr().String(), ReadHeaderTimeout: time.Second}
	err = serve.Run(context.Background(), srv, zerolog.Nop())
	require.ErrorContains(t, err, "listen on "+ln.Addr().String())
}

func TestRunServesUntilCancelled(t *testing.T) {
	t.Parallel()
	// Pick a free port, release it, and let Run listen on it.
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	require.NoError(t, err)
	addr := ln.Addr().String()
	require.NoError(t, ln.Close())

	health := &serve.Health{}
	health.SetReady(true)
	srv := &http.Server{Addr: addr, Handler: serve.NewMux(prometheus.NewRegistry(), health), ReadHeaderTimeout: time.Second}
	ctx, cancel := context.WithCancel(context.Background())
	done := make(chan error, 1)
	go func() { done <- serve.Run(ctx, srv, zerolog.Nop()) }()

	require.Eventually(t, func() bool {
		resp, err := http.Get("http://" + addr + "/readyz")
		if err != nil {
			return false
		}
		_ = resp.Body.Close()
		return resp.StatusCode == http.StatusOK
	}, 5*time.Second, 10*time.Millisecond)
	cancel()
	require.NoError(t, <-done)
}

func TestDecodeJSONRejectsNUL(t *testing.T) {
	t.Parallel()
	var v struct {
		Reason string `json:"reason"`
	}
	r := httptest.NewRequest(http.MethodPost, "/", strings.NewReader(`{"reason":"a\u0000b"}`))
	r.Header.Set("Content-Type", "application/json")
	err := serve.DecodeJSON(r, 1024, &v)
	require.ErrorIs(t, err, contract.ErrInvalid)
	var fe *contract.FieldError
	require.ErrorAs(t, err, &fe)
	require.Equal(t, "reason", fe.Field)
}

func TestDecodeJSONRequiresAJSONContentType(t *testing.T) {
	t.Parallel()
	for _, tc := range []struct {
		contentType string
		ok          bool
	}{
		{"application/json", true},
		{"application/json; charset=utf-8", true},
		{"application/cloudevents+json", true},
		{"", false},
		{"text/plain", false},
		{"application/x-www-form-urlencoded", false},
		{"multipart/form-data; boundary=x", false},
		{"application/jsonx", false},
		{"not a media type;;", false},
	} {
		r := httptest.NewRequest(http.MethodPost, "/", strings.NewReader(`{"name":"x"}`))
		if tc.contentType != "" {
			r.Header.Set("Content-Type", tc.contentType)
		}
		var v request
		err := serve.DecodeJSON(r, 1024, &v)
		if tc.ok {
			require.NoError(t, err, tc.contentType)
			continue
		}
		require.ErrorIs(t, err, serve.ErrUnsupportedMediaType, tc.contentType)
		status, detail := serve.Describe(err)
		require.Equal(t, http.StatusUnsupportedMediaType, status)
		require.Equal(t, serve.CodeMediaType, detail.Code)
		require.Equal(t, "Content-Type", detail.Field)
	}
}

// A page of another origin cannot change anything through a browser: its
// unsafe requests are refused before any handler runs, while clients that
// send no browser headers (curl, the CLI, services) and same-origin pages
// pass.
func TestServerRefusesCrossOriginWrites(t *testing.T) {
	t.Parallel()
	var handled int
	srv := serve.NewServer("", http.HandlerFunc(func(w http.ResponseWriter, _ *http.Request) {
		handled++
		w.WriteHeader(http.StatusNoContent)
	}))
	require.Equal(t, serve.ReadTimeout, srv.ReadTimeout)
	require.Equal(t, serve.WriteTimeout, srv.WriteTimeout)
	require.Equal(t, serve.MaxHeaderBytes, srv.MaxHeaderBytes)
	for _, tc := range []struct {
		name, method string
		headers      map[string]string
		want         int
	}{
		{"cross-site POST", http.MethodPost, map[string]string{"Sec-Fetch-Site": "cross-site"}, http.StatusForbidden},
		{"same-site POST from another origin", http.MethodPut, map[string]string{"Sec-Fetch-Site": "same-site"}, http.StatusForbidden},
		{"old browser, foreign Origin", http.MethodDelete, map[string]string{"Origin": "https://evil.example"}, http.StatusForbidden},
		{"same-origin POST", http.MethodPost, map[string]string{"Sec-Fetch-Site": "same-origin"}, http.StatusNoContent},
		{"curl POST", http.MethodPost, nil, http.StatusNoContent},
		{"cross-site GET", http.MethodGet, map[string]string{"Sec-Fetch-Site": "cross-site"}, http.StatusNoContent},
	} {
		r := httptest.NewRequest(tc.method, "http://retryd.local/v1/sources/shop/pause", strings.NewReader(`{}`))
		for k, v := range tc.headers {
			r.Header.Set(k, v)
		}
		rec := httptest.NewRecorder()
		before := handled
		srv.Handler.ServeHTTP(rec, r)
		require.Equal(t, tc.want, rec.Code, tc.name)
		if tc.want == http.StatusForbidden {
			require.Equal(t, before, handled, "%s reached the handler", tc.name)
			require.Contains(t, rec.Body.String(), `"code":"cross_origin"`)
		}
	}
}

// /readyz follows the dependencies Watch probes: a lost one turns it 503,
// naming it, within a couple of probe intervals, and back once it answers.
func TestReadinessFollowsDependencies(t *testing.T) {
	t.Parallel()
	var pgDown atomic.Bool
	h := &serve.Health{}
	h.SetReady(true)
	ctx, cancel := context.WithCancel(context.Background())
	t.Cleanup(cancel)
	go h.Watch(ctx, 20*time.Millisecond,
		serve.Check{Name: "postgres", Probe: func(context.Context) error {
			if pgDown.Load() {
				return errors.New("connection refused")
			}
			return nil
		}},
		serve.Check{Name: "nats", Probe: func(context.Context) error { return nil }},
	)
	mux := serve.NewMux(nil, h)
	readyz := func() (int, string) {
		rec := httptest.NewRecorder()
		mux.ServeHTTP(rec, httptest.NewRequest(http.MethodGet, "/readyz", nil))
		return rec.Code, rec.Body.String()
	}
	require.Eventually(t, func() bool { c, _ := readyz(); return c == http.StatusOK }, 5*time.Second, 5*time.Millisecond)

	pgDown.Store(true)
	require.Eventually(t, func() bool { c, _ := readyz(); return c == http.StatusServiceUnavailable }, 5*time.Second, 5*time.Millisecond)
	_, body := readyz()
	require.JSONEq(t, `{"status":"not_ready","down":["postgres"]}`, body)
	require.Equal(t, []string{"postgres"}, h.Down())

	pgDown.Store(false)
	require.Eventually(t, func() bool { c, _ := readyz(); return c == http.StatusOK }, 5*time.Second, 5*time.Millisecond)

	h.SetReady(false)
	code, body := readyz()
	require.Equal(t, http.StatusServiceUnavailable, code, "a graceful stop turns readiness off whatever the probes say")
	require.JSONEq(t, `{"status":"not_ready"}`, body)
}
