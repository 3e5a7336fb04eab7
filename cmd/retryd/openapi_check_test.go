package main

import (
	"bytes"
	"cmp"
	"context"
	"encoding/json"
	"errors"
	"io"
	"net/http"
	"slices"
	"strings"
	"testing"
	"time"

	"github.com/getkin/kin-openapi/openapi3"
	"github.com/getkin/kin-openapi/openapi3filter"
	"github.com/getkin/kin-openapi/routers"
	"github.com/getkin/kin-openapi/routers/gorillamux"
	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
)

// apiCall is one request to the running stack and the answer it must get.
type apiCall struct {
	method, path string
	// as names the token sent (a key of specChecker.tokens); "" sends none.
	as   string
	body string
	// contentType of the body; default application/json.
	contentType string
	want        int
	// refused marks a request the spec itself rejects, as the server
	// does: its validation must fail. The answer is still checked.
	refused bool
	// keep reads the answer, for the ids the next calls use.
	keep func(body []byte)
}

// specChecker sends calls to a running stack and checks every request and
// answer against the spec, remembering which operations were exercised.
type specChecker struct {
	t      *testing.T
	doc    *openapi3.T
	router routers.Router
	api    string
	tokens map[string]string
	seen   map[string]bool
}

func newSpecChecker(t *testing.T, api string) *specChecker {
	t.Helper()
	doc := loadSpec(t)
	// The spec names retryd dev's default address; the stack under test
	// listens on a free port.
	doc.Servers = openapi3.Servers{{URL: api}}
	router, err := gorillamux.NewRouter(doc)
	require.NoError(t, err)
	return &specChecker{t: t, doc: doc, router: router, api: api, tokens: map[string]string{}, seen: map[string]bool{}}
}

// options of every validation: the answer's status must be one the
// operation lists, and a bearer token must be sent where security asks.
func checkOptions() *openapi3filter.Options {
	return &openapi3filter.Options{
		IncludeResponseStatus: true,
		SkipSettingDefaults:   true,
		MultiError:            true,
		AuthenticationFunc: func(_ context.Context, in *openapi3filter.AuthenticationInput) error {
			h := in.RequestValidationInput.Request.Header.Get("Authorization")
			if !strings.HasPrefix(h, "Bearer ") {
				return errors.New("no bearer token")
			}
			return nil
		},
	}
}

func (c *specChecker) request(call apiCall) *http.Request {
	c.t.Helper()
	var body io.Reader
	if call.body != "" {
		body = strings.NewReader(call.body)
	}
	req, err := http.NewRequest(call.method, c.api+call.path, body)
	require.NoError(c.t, err)
	if call.body != "" {
		req.Header.Set("Content-Type", cmp.Or(call.contentType, "application/json"))
	}
	if call.as != "" {
		tok, ok := c.tokens[call.as]
		require.True(c.t, ok, "no token %q", call.as)
		req.Header.Set("Authorization", "Bearer "+tok)
	}
	return req
}

// run sends each call in order and checks it.
func (c *specChecker) run(calls ...apiCall) {
	c.t.Helper()
	for _, call := range calls {
		c.check(call)
	}
}

func (c *specChecker) check(call apiCall) {
	c.t.Helper()
	name := call.method + " " + call.path
	route, params, err := c.router.FindRoute(c.request(call))
	require.NoError(c.t, err, "%s is not a route of the spec", name)
	c.seen[call.method+" "+route.Path] = true
	in := &openapi3filter.RequestValidationInput{Request: c.request(call), PathParams: params, Route: route, Options: checkOptions()}
	reqErr := openapi3filter.ValidateRequest(context.Background(), in)
	if call.refused {
		assert.Error(c.t, reqErr, "%s: the spec accepts a request the test expects it to refuse", name)
	} else {
		assert.NoError(c.t, reqErr, "%s: the request does not fit the spec", name)
	}

	resp, err := http.DefaultClient.Do(c.request(call))
	require.NoError(c.t, err, name)
	defer resp.Body.Close()
	body, err := io.ReadAll(resp.Body)
	require.NoError(c.t, err, name)
	require.Equal(c.t, call.want, resp.StatusCode, "%s: %s", name, body)
	out := &openapi3filter.ResponseValidationInput{
		RequestValidationInput: in, Status: resp.StatusCode, Header: resp.Header, Options: checkOptions(),
	}
	out.SetBodyBytes(body)
	assert.NoError(c.t, openapi3filter.ValidateResponse(context.Background(), out), "%s: the answer %d does not fit the spec: %s", name, resp.StatusCode, body)
	if call.keep != nil {
		call.keep(body)
	}
}

// waitFor GETs path as a role until ok holds of the answer, without
// checking it: the check is the caller's next call.
func (c *specChecker) waitFor(path, as string, ok func(status int, body []byte) bool) {
	c.t.Helper()
	var status int
	var body []byte
	// Built once, outside the polling goroutine: a GET without a body can
	// be sent again.
	req := c.request(apiCall{method: http.MethodGet, path: path, as: as})
	if !assert.Eventually(c.t, func() bool {
		resp, err := http.DefaultClient.Do(req)
		if err != nil {
			return false
		}
		defer resp.Body.Close()
		body, _ = io.ReadAll(resp.Body)
		status = resp.StatusCode
		return ok(status, body)
	}, wait, 50*time.Millisecond) {
		c.t.Fatalf("GET %s: last answer %d %s", path, status, body)
	}
}

// unexercised lists the spec's operations no call reached.
func (c *specChecker) unexercised() []string {
	var out []string
	for key := range specOperations(c.doc) {
		if !c.seen[key] {
			out = append(out, key)
		}
	}
	slices.Sort(out)
	return out
}

// jsonString reads the string at a path of keys of a JSON object.
func jsonString(t *testing.T, body []byte, keys ...string) string {
	t.Helper()
	var v any
	requireJSON(t, body, &v)
	for _, k := range keys {
		m, ok := v.(map[string]any)
		require.True(t, ok, "%v in %s", keys, body)
		v = m[k]
	}
	s, ok := v.(string)
	require.True(t, ok, "%v in %s is not a string", keys, body)
	return s
}

func requireJSON(t *testing.T, body []byte, v any) {
	t.Helper()
	require.NoError(t, json.Unmarshal(body, v), "%s", body)
}

// status200 is a waitFor condition: the GET answers 200 and has want in
// its body.
func status200(want string) func(int, []byte) bool {
	return func(status int, body []byte) bool {
		return status == http.StatusOK && bytes.Contains(body, []byte(want))
	}
}
