package main

import (
	"bytes"
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"net/http"
	"net/url"
	"strings"
	"time"

	"github.com/retryd/retryd/internal/serve"
)

// maxResponseBytes bounds what the CLI reads of one API response.
const maxResponseBytes = 32 << 20

// apiClient calls a retryd HTTP API. The dev runner serves every service's
// API on one address; in a deployment --api points at a gateway or at the
// service that owns the routes used.
type apiClient struct {
	base    *url.URL
	http    *http.Client
	timeout time.Duration
	token   string // bearer token (--token, RETRYD_TOKEN); empty sends none
	// header is sent with every request (an Idempotency-Key).
	header http.Header
}

func newAPIClient(base string, timeout time.Duration) (*apiClient, error) {
	u, err := url.Parse(strings.TrimRight(base, "/"))
	if err != nil || (u.Scheme != "http" && u.Scheme != "https") || u.Host == "" {
		return nil, usageErr(fmt.Errorf("--api %q is not an http(s) URL such as %s", base, defaultAPI))
	}
	if timeout <= 0 {
		timeout = defaultTimeout
	}
	return &apiClient{base: u, http: &http.Client{}, timeout: timeout}, nil
}

// apiError is an error answer of the API: its status and error body.
type apiError struct {
	Status  int
	Code    string
	Message string
	Field   string
}

func (e *apiError) Error() string {
	msg := e.Message
	if msg == "" {
		msg = http.StatusText(e.Status)
	}
	if e.Field != "" && !strings.Contains(msg, e.Field) {
		msg = e.Field + ": " + msg
	}
	return fmt.Sprintf("%s (HTTP %d %s)", msg, e.Status, e.Code)
}

// errUnreachable is wrapped when no server answered.
var errUnreachable = errors.New("retryd API unreachable")

// do sends a request with an optional JSON body and returns the raw
// response body of a 2xx answer; other answers become *apiError.
func (c *apiClient) do(ctx context.Context, method, path string, query url.Values, body any) (json.RawMessage, error) {
	u := *c.base
	// path holds escaped segments (seg): keep them as they are.
	u.RawPath = c.base.EscapedPath() + path
	if p, err := url.PathUnescape(u.RawPath); err == nil {
		u.Path = p
	}
	if len(query) > 0 {
		u.RawQuery = query.Encode()
	}
	var rd io.Reader
	if body != nil {
		b, err := json.Marshal(body)
		if err != nil {
			return nil, fmt.Errorf("encode request: %w", err)
		}
		rd = bytes.NewReader(b)
	}
	ctx, cancel := context.WithTimeout(ctx, c.timeout)
	defer cancel()
	req, err := http.NewRequestWithContext(ctx, method, u.String(), rd)
	if err != nil {
		return nil, fmt.Errorf("build request: %w", err)
	}
	req.Header.Set("Accept", "application/json")
	req.Header.Set("User-Agent", "retryd-cli")
	if body != nil {
		req.Header.Set("Content-Type", "application/json")
	}
	if c.token != "" {
		req.Header.Set("Authorization", "Bearer "+c.token)
	}
	for k, v := range c.header {
		req.Header[k] = v
	}
	resp, err := c.http.Do(req)
	if err != nil {
		return nil, fmt.Errorf("%w at %s: %w (is `retryd dev` running? set --api or %s)", errUnreachable, c.base, err, envAPI)
	}
	defer resp.Body.Close()
	raw, err := io.ReadAll(io.LimitReader(resp.Body, maxResponseBytes))
	if err != nil {
		return nil, fmt.Errorf("read response of %s %s: %w", method, path, err)
	}
	if resp.StatusCode/100 != 2 {
		err := decodeAPIError(resp.StatusCode, raw)
		if resp.StatusCode == http.StatusUnauthorized {
			if c.token == "" {
				return nil, fmt.Errorf("%w\n(this API wants a token: pass --token or set %s)", err, envToken)
			}
			return nil, fmt.Errorf("%w\n(the token of --token or %s is not valid: unknown, revoked or expired)", err, envToken)
		}
		return nil, err
	}
	return raw, nil
}

func decodeAPIError(status int, raw []byte) error {
	var body serve.ErrorBody
	e := &apiError{Status: status}
	if json.Unmarshal(raw, &body) == nil && body.Error.Code != "" {
		e.Code, e.Message, e.Field = body.Error.Code, body.Error.Message, body.Error.Field
		return e
	}
	e.Code = "http_" + fmt.Sprint(status)
	e.Message = strings.TrimSpace(string(raw))
	if len(e.Message) > 200 {
		e.Message = e.Message[:200] + "…"
	}
	if status == http.StatusNotFound && e.Message == "404 page not found" {
		e.Message = "this server does not serve that route (is --api the retryd API?)"
	}
	return e
}

// get, post and put decode the answer into out (when not nil) and return
// the raw body, which --json prints.
func (c *apiClient) get(ctx context.Context, path string, query url.Values, out any) (json.RawMessage, error) {
	return c.call(ctx, http.MethodGet, path, query, nil, out)
}

func (c *apiClient) post(ctx context.Context, path string, body, out any) (json.RawMessage, error) {
	return c.call(ctx, http.MethodPost, path, nil, body, out)
}

func (c *apiClient) put(ctx context.Context, path string, body, out any) (json.RawMessage, error) {
	return c.call(ctx, http.MethodPut, path, nil, body, out)
}

func (c *apiClient) call(ctx context.Context, method, path string, query url.Values, body, out any) (json.RawMessage, error) {
	raw, err := c.do(ctx, method, path, query, body)
	if err != nil {
		return nil, err
	}
	if out != nil {
		if err := json.Unmarshal(raw, out); err != nil {
			return nil, fmt.Errorf("decode answer of %s %s: %w", method, path, err)
		}
	}
	return raw, nil
}

// seg escapes one path segment.
func seg(s string) string { return url.PathEscape(s) }

// isNotFound reports an API 404.
func isNotFound(err error) bool {
	var ae *apiError
	return errors.As(err, &ae) && ae.Status == http.StatusNotFound
}
