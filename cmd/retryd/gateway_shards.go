package main

import (
	"bytes"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"net"
	"net/http"
	"net/url"
	"slices"
	"strings"
	"sync"

	"github.com/rs/zerolog"

	"github.com/retryd/retryd/internal/serve"
	"github.com/retryd/retryd/pkg/contract"
)

const (
	// maxShardReply bounds a shard's reply the gateway reads whole: a list
	// page of 1000 retries from each shard fits many times over.
	maxShardReply = 64 << 20
	// maxForwardBody bounds a request body the gateway keeps to send to
	// more than one shard; the scheduler itself takes 64 KiB.
	maxForwardBody = 1 << 20
)

// schedulerShards is the scheduler shards behind the gateway, urls[k]
// being shard k's (docs/shards.md). Each shard's operator API sees its
// own database only, so the gateway routes an item's requests to the
// item's shard, merges the list of every shard, writes policies to every
// shard and sends what is not per shard (tokens, audit, policy reads) to
// shard 0, the home shard.
type schedulerShards struct {
	urls   []*url.URL
	client *http.Client
	// home proxies a request to shard 0 as the gateway proxies any route.
	home http.Handler
	log  zerolog.Logger
}

func newSchedulerShards(urls []*url.URL, transport http.RoundTripper, home http.Handler, log zerolog.Logger) *schedulerShards {
	return &schedulerShards{
		urls: urls,
		// Redirects are the caller's to follow, as through the proxy.
		client: &http.Client{Transport: transport, CheckRedirect: func(*http.Request, []*http.Request) error { return http.ErrUseLastResponse }},
		home:   home,
		log:    log,
	}
}

// register mounts the scheduler's routes on mux.
func (s *schedulerShards) register(mux *http.ServeMux) {
	mux.HandleFunc("/v1/retries", s.serveList)
	mux.HandleFunc("/v1/retries/", s.serveItem)
	mux.HandleFunc("/v1/policies/", s.servePolicy)
	for _, p := range []string{"/v1/policies", "/v1/tokens", "/v1/tokens/", "/v1/audit"} {
		mux.Handle(p, s.home)
	}
}

// shardReply is one shard's answer, read whole; err is set when the
// shard could not be reached or its reply not read.
type shardReply struct {
	shard  int
	status int
	header http.Header
	body   []byte
	err    error
}

func (rep shardReply) ok() bool { return rep.err == nil && rep.status/100 == 2 }

// write relays the reply as the proxy would.
func (rep shardReply) write(w http.ResponseWriter) {
	h := w.Header()
	for k, vs := range rep.header {
		if k == "Content-Length" || isHopHeader(k) {
			continue
		}
		h[k] = vs
	}
	w.WriteHeader(rep.status)
	_, _ = w.Write(rep.body)
}

// describe names what went wrong with a reply that is not ok, for a
// message naming the shard.
func (rep shardReply) describe() string {
	if rep.err != nil {
		return "unreachable"
	}
	var body serve.ErrorBody
	if json.Unmarshal(rep.body, &body) == nil && body.Error.Code != "" {
		return fmt.Sprintf("HTTP %d %s: %s", rep.status, body.Error.Code, body.Error.Message)
	}
	return fmt.Sprintf("HTTP %d", rep.status)
}

// hopHeaders are the headers of one connection, never forwarded.
var hopHeaders = []string{"Connection", "Proxy-Connection", "Keep-Alive", "Proxy-Authenticate", "Proxy-Authorization", "Te", "Trailer", "Transfer-Encoding", "Upgrade"}

func isHopHeader(k string) bool { return slices.Contains(hopHeaders, http.CanonicalHeaderKey(k)) }

// send sends r to shard with the path, query and body given, as the
// proxy sends a request (the caller's headers, X-Forwarded-*), and reads
// the reply whole.
func (s *schedulerShards) send(r *http.Request, shard int, path, rawQuery string, body []byte) shardReply {
	rep := shardReply{shard: shard}
	target := *s.urls[shard]
	target.Path = strings.TrimSuffix(target.Path, "/") + path
	target.RawPath, target.RawQuery = "", rawQuery
	var rd io.Reader
	if body != nil {
		rd = bytes.NewReader(body)
	}
	out, err := http.NewRequestWithContext(r.Context(), r.Method, target.String(), rd)
	if err != nil {
		rep.err = fmt.Errorf("build request: %w", err)
		return rep
	}
	out.Header = r.Header.Clone()
	for _, k := range r.Header.Values("Connection") {
		for f := range strings.SplitSeq(k, ",") {
			out.Header.Del(strings.TrimSpace(f))
		}
	}
	for _, k := range hopHeaders {
		out.Header.Del(k)
	}
	// The gateway reads some replies (a list page, an error): the
	// transport asks for and undoes its own compression instead.
	out.Header.Del("Accept-Encoding")
	// As httputil.ProxyRequest.SetXForwarded: the caller as this gateway
	// saw it, not what it claimed.
	out.Header.Del("Forwarded")
	if ip, _, err := net.SplitHostPort(r.RemoteAddr); err == nil {
		out.Header.Set("X-Forwarded-For", ip)
	} else {
		out.Header.Del("X-Forwarded-For")
	}
	out.Header.Set("X-Forwarded-Host", r.Host)
	proto := "http"
	if r.TLS != nil {
		proto = "https"
	}
	out.Header.Set("X-Forwarded-Proto", proto)
	resp, err := s.client.Do(out)
	if err != nil {
		rep.err = err
		return rep
	}
	defer resp.Body.Close()
	rep.body, err = io.ReadAll(io.LimitReader(resp.Body, maxShardReply+1))
	switch {
	case err != nil:
		rep.err = fmt.Errorf("read reply: %w", err)
	case len(rep.body) > maxShardReply:
		rep.err = fmt.Errorf("reply larger than %d bytes", maxShardReply)
	}
	rep.status, rep.header = resp.StatusCode, resp.Header
	return rep
}

// fanOut sends to each shard at once and returns their replies in the
// order of shards.
func (s *schedulerShards) fanOut(shards []int, send func(shard int) shardReply) []shardReply {
	out := make([]shardReply, len(shards))
	var wg sync.WaitGroup
	for i, k := range shards {
		wg.Go(func() { out[i] = send(k) })
	}
	wg.Wait()
	return out
}

// unreachable answers 502 naming the shard a request could not get an
// answer from.
func (s *schedulerShards) unreachable(w http.ResponseWriter, r *http.Request, rep shardReply) {
	s.log.Warn().Err(rep.err).Int("shard", rep.shard).Str("upstream", s.urls[rep.shard].Host).Str("path", r.URL.Path).
		Msg("scheduler shard unreachable")
	writeBadGateway(w, fmt.Sprintf("scheduler shard %d, behind %s, is unreachable", rep.shard, r.URL.Path))
}

func writeBadGateway(w http.ResponseWriter, msg string) {
	serve.WriteJSON(w, http.StatusBadGateway, serve.ErrorBody{Error: serve.ErrorDetail{Code: "bad_gateway", Message: msg}})
}

// readBody reads the request body to send it to more than one shard; on
// false it has answered.
func readBody(w http.ResponseWriter, r *http.Request) ([]byte, bool) {
	if r.Body == nil || r.Body == http.NoBody {
		return nil, true
	}
	b, err := io.ReadAll(http.MaxBytesReader(w, r.Body, maxForwardBody))
	if err != nil {
		var tooLarge *http.MaxBytesError
		if !errors.As(err, &tooLarge) {
			err = &contract.FieldError{Field: "body", Reason: "could not be read: " + err.Error(), Err: contract.ErrInvalid}
		}
		serve.WriteError(w, err)
		return nil, false
	}
	return b, true
}

// itemPath reads /v1/retries/{kind}/{id} and /v1/retries/{kind}/{id}/{cancel,retry}.
func itemPath(path string) (kind, id string, ok bool) {
	parts := strings.Split(strings.TrimPrefix(path, "/v1/retries/"), "/")
	switch {
	case len(parts) == 3 && (parts[2] == "cancel" || parts[2] == "retry"):
	case len(parts) != 2:
		return "", "", false
	}
	return parts[0], parts[1], parts[0] != "" && parts[1] != ""
}

// serveItem sends an item's request to its shard and, on a 404 there,
// to the shards it had under the previous layouts (contract.ShardsOf); the
// answer is the first that is not a 404, else the item's shard's 404. A
// shard that cannot be reached ends the search with a 502: the item may
// be there.
func (s *schedulerShards) serveItem(w http.ResponseWriter, r *http.Request) {
	kind, id, ok := itemPath(r.URL.Path)
	if !ok {
		s.home.ServeHTTP(w, r)
		return
	}
	// Checked here as the scheduler checks them, so that a malformed
	// path answers the same 400 without a request to any shard.
	if err := firstErr(contract.ValidateKind("kind", kind), contract.ValidateID("id", id)); err != nil {
		serve.WriteError(w, err)
		return
	}
	body, ok := readBody(w, r)
	if !ok {
		return
	}
	var first shardReply
	for i, shard := range contract.ShardsOf(kind, id, len(s.urls)) {
		rep := s.send(r, shard, r.URL.Path, r.URL.RawQuery, body)
		if rep.err != nil {
			s.unreachable(w, r, rep)
			return
		}
		if rep.status != http.StatusNotFound {
			rep.write(w)
			return
		}
		if i == 0 {
			first = rep
		}
	}
	first.write(w)
}

func firstErr(errs ...error) error {
	for _, err := range errs {
		if err != nil {
			return err
		}
	}
	return nil
}

// servePolicy writes a policy to every shard (PUT
// /v1/policies/{kind}/{job_type}) and sends anything else to shard 0.
// Every shard decides with its own copy of the policies, so a PUT goes
// to shard 0 first: a refusal there (invalid, version conflict) is the
// answer and no shard changed. Then it goes to the other shards at once,
// without "version": shard 0's version is the one checked, the others
// follow it. The answer is shard 0's when every shard took it; else a
// 502 naming the shards that did not, and saying to PUT it again.
func (s *schedulerShards) servePolicy(w http.ResponseWriter, r *http.Request) {
	parts := strings.Split(strings.TrimPrefix(r.URL.Path, "/v1/policies/"), "/")
	if r.Method != http.MethodPut || len(parts) != 2 {
		s.home.ServeHTTP(w, r)
		return
	}
	body, ok := readBody(w, r)
	if !ok {
		return
	}
	home := s.send(r, 0, r.URL.Path, r.URL.RawQuery, body)
	if home.err != nil {
		s.unreachable(w, r, home)
		return
	}
	if !home.ok() {
		home.write(w)
		return
	}
	rest := withoutVersion(body)
	others := make([]int, 0, len(s.urls)-1)
	for k := 1; k < len(s.urls); k++ {
		others = append(others, k)
	}
	var failed []string
	for _, rep := range s.fanOut(others, func(k int) shardReply { return s.send(r, k, r.URL.Path, r.URL.RawQuery, rest) }) {
		if !rep.ok() {
			s.log.Warn().Err(rep.err).Int("shard", rep.shard).Int("status", rep.status).Str("path", r.URL.Path).
				Msg("policy not written to every shard")
			failed = append(failed, fmt.Sprintf("shard %d (%s)", rep.shard, rep.describe()))
		}
	}
	if len(failed) == 0 {
		home.write(w)
		return
	}
	writeBadGateway(w, fmt.Sprintf("policy %s/%s was saved on shard 0 but not on %s: every shard decides with its own copy, "+
		"so PUT the same policy again (without \"version\") until every shard answers; each PUT stores a new version on each shard it reaches",
		parts[0], parts[1], strings.Join(failed, ", ")))
}

// withoutVersion is a policy body without its "version" (matched as the
// scheduler's JSON decoding matches it, ignoring case), or body as it is
// when it is not a JSON object.
func withoutVersion(body []byte) []byte {
	var fields map[string]json.RawMessage
	if json.Unmarshal(body, &fields) != nil {
		return body
	}
	n := len(fields)
	for k := range fields {
		if strings.EqualFold(k, "version") {
			delete(fields, k)
		}
	}
	if len(fields) == n {
		return body
	}
	b, err := json.Marshal(fields)
	if err != nil {
		return body
	}
	return b
}
