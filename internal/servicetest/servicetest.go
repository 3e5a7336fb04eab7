// Package servicetest holds what the tests of retryd's services and
// programs share: JSON requests to an HTTP API (and sending them until a
// full stream refuses them), the tests' logger, a log sink to read, a
// metric's value, and stopping an instance when the test ends.
package servicetest

import (
	"bytes"
	"context"
	"encoding/json"
	"io"
	"net/http"
	"os"
	"reflect"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/prometheus/client_golang/prometheus"
	"github.com/rs/zerolog"
	"github.com/stretchr/testify/require"
)

// Logger is the logger a test runs a service with: silent unless
// RETRYD_TEST_LOG is set, then written through t.Log so that it shows
// with the failing test only.
func Logger(t testing.TB) zerolog.Logger {
	if os.Getenv("RETRYD_TEST_LOG") == "" {
		return zerolog.Nop()
	}
	return zerolog.New(zerolog.NewTestWriter(t)).With().Timestamp().Logger()
}

// Do sends a request to url and decodes a JSON answer into out (when out
// is not nil); it returns the status. The body is sent as it is when a
// string or []byte, as JSON otherwise, and not at all when nil or "",
// always as application/json; headers are name, value pairs. out is zeroed first, so that fields an
// answer leaves out do not keep what an earlier answer put there, and an
// empty answer leaves it zero.
func Do(t testing.TB, ctx context.Context, method, url string, body, out any, headers ...string) int {
	t.Helper()
	resp, raw := Request(t, ctx, method, url, body, headers...)
	if out != nil {
		v := reflect.ValueOf(out).Elem()
		v.Set(reflect.Zero(v.Type()))
		if len(raw) > 0 {
			require.NoError(t, json.Unmarshal(raw, out), "body: %s", raw)
		}
	}
	return resp.StatusCode
}

// Request is Do for a caller that reads the answer itself: it returns the
// response (its body already read and closed) and the body.
func Request(t testing.TB, ctx context.Context, method, url string, body any, headers ...string) (*http.Response, []byte) {
	t.Helper()
	var rd io.Reader
	switch v := body.(type) {
	case nil:
	case string:
		if v != "" {
			rd = strings.NewReader(v)
		}
	case []byte:
		rd = bytes.NewReader(v)
	default:
		raw, err := json.Marshal(v)
		require.NoError(t, err)
		rd = bytes.NewReader(raw)
	}
	req, err := http.NewRequestWithContext(ctx, method, url, rd)
	require.NoError(t, err)
	req.Header.Set("Content-Type", "application/json")
	for i := 0; i+1 < len(headers); i += 2 {
		req.Header.Set(headers[i], headers[i+1])
	}
	resp, err := http.DefaultClient.Do(req)
	require.NoError(t, err)
	defer resp.Body.Close()
	raw, err := io.ReadAll(resp.Body)
	require.NoError(t, err)
	return resp, raw
}

// StopOnCleanup stops an instance when the test ends, giving it within
// to finish: t.Context() is already cancelled when cleanups run, so the
// stop gets a context of its own.
func StopOnCleanup(t testing.TB, within time.Duration, stop func(context.Context) error) {
	t.Cleanup(func() {
		ctx, cancel := context.WithTimeout(context.Background(), within)
		defer cancel()
		_ = stop(ctx)
	})
}

// Buffer is a log sink a test reads while the code under test writes to
// it from other goroutines.
type Buffer struct {
	mu  sync.Mutex
	buf bytes.Buffer
}

func (b *Buffer) Write(p []byte) (int, error) {
	b.mu.Lock()
	defer b.mu.Unlock()
	return b.buf.Write(p)
}

func (b *Buffer) String() string {
	b.mu.Lock()
	defer b.mu.Unlock()
	return b.buf.String()
}

// Metric sums the series of the metric name in g whose labels include
// the name, value pairs given: counters and gauges by value, histograms
// by their count of observations. A metric g does not hold sums to 0.
func Metric(t testing.TB, g prometheus.Gatherer, name string, labels ...string) float64 {
	t.Helper()
	families, err := g.Gather()
	require.NoError(t, err)
	var sum float64
	for _, f := range families {
		if f.GetName() != name {
			continue
		}
	series:
		for _, m := range f.GetMetric() {
			for i := 0; i+1 < len(labels); i += 2 {
				found := false
				for _, lp := range m.GetLabel() {
					if lp.GetName() == labels[i] && lp.GetValue() == labels[i+1] {
						found = true
					}
				}
				if !found {
					continue series
				}
			}
			switch {
			case m.Counter != nil:
				sum += m.GetCounter().GetValue()
			case m.Gauge != nil:
				sum += m.GetGauge().GetValue()
			case m.Histogram != nil:
				sum += float64(m.GetHistogram().GetSampleCount())
			}
		}
	}
	return sum
}
