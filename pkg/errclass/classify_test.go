package errclass_test

import (
	"context"
	"errors"
	"fmt"
	"io"
	"io/fs"
	"net"
	"net/http"
	"os"
	"syscall"
	"testing"
	"time"

	"github.com/stretchr/testify/require"

	"github.com/retryd/retryd/pkg/errclass"
)

func TestClassifyMessageDefaults(t *testing.T) {
	t.Parallel()
	tests := []struct {
		msg  string
		want errclass.Class
	}{
		// timeout
		{"Network timeout occurred", errclass.Timeout},
		{"dial tcp 10.0.0.1:443: i/o timeout", errclass.Timeout},
		{"request timed out after 30s", errclass.Timeout},
		{"context deadline exceeded", errclass.Timeout},
		{"connect ETIMEDOUT 10.0.0.1:443", errclass.Timeout},
		{"504 Gateway Timeout", errclass.Timeout},
		{"unexpected status 408", errclass.Timeout},
		// rate_limit
		{"429 Too Many Requests", errclass.RateLimit},
		{"HTTP 429", errclass.RateLimit},
		{"LinkedIn API rate limit reached", errclass.RateLimit},
		{"rate_limit_exceeded", errclass.RateLimit},
		{"request was throttled", errclass.RateLimit},
		{"daily quota exceeded", errclass.RateLimit},
		{"rpc error: code = ResourceExhausted", errclass.RateLimit},
		{"rpc error: code = DeadlineExceeded", errclass.Timeout},
		{"rpc error: code = Unavailable", errclass.Temporary},
		{"RESOURCE_EXHAUSTED: try later", errclass.RateLimit},
		// network
		{"connect ECONNREFUSED 127.0.0.1:5432", errclass.Network},
		{"read ECONNRESET", errclass.Network},
		{"dial tcp 127.0.0.1:4222: connect: connection refused", errclass.Network},
		{"read tcp: connection reset by peer", errclass.Network},
		{"unexpected EOF", errclass.Network},
		{"EOF", errclass.Network},
		{"dial tcp: lookup api.example.com: no such host", errclass.Network},
		{"getaddrinfo ENOTFOUND api.example.com", errclass.Network},
		{"write: broken pipe", errclass.Network},
		{"connect: network is unreachable", errclass.Network},
		{"no route to host", errclass.Network},
		// temporary
		{"temporary failure", errclass.Temporary},
		{"Service temporarily overloaded", errclass.Temporary},
		{"503 Service Unavailable", errclass.Temporary},
		{"upstream status 500", errclass.Temporary},
		{"HTTP/1.1 502", errclass.Temporary},
		{"500 Internal Server Error", errclass.Temporary},
		{"502 Bad Gateway", errclass.Temporary},
		{"resource busy, try again", errclass.Temporary},
		{"status code: 599", errclass.Temporary},
		// authentication
		{"401 Unauthorized", errclass.Authentication},
		{"invalid credentials", errclass.Authentication},
		{"Invalid Credentials for user", errclass.Authentication},
		{"authentication failed", errclass.Authentication},
		{"rpc error: code = Unauthenticated", errclass.Authentication},
		{"expired access token", errclass.Authentication},
		{"error 401", errclass.Authentication},
		// permission
		{"403 Forbidden", errclass.Permission},
		{"open /etc/shadow: permission denied", errclass.Permission},
		{"Access Denied", errclass.Permission},
		{"user is not authorized to perform s3:PutObject", errclass.Permission},
		{"insufficient permissions", errclass.Permission},
		{"EACCES", errclass.Permission},
		{"status=403", errclass.Permission},
		// validation
		{"validation failed: email is required", errclass.Validation},
		{"invalid job configuration", errclass.Validation},
		{"malformed JSON payload", errclass.Validation},
		{"400 Bad Request", errclass.Validation},
		{"response code 400", errclass.Validation},
		{"422 Unprocessable Entity", errclass.Validation},
		// precedence: retryable classes first
		{"invalid response: service unavailable", errclass.Temporary},
		{"validation service timed out", errclass.Timeout},
		{"forbidden: rate limit for anonymous users", errclass.RateLimit},
		// unknown: numbers without a status word, near misses
		{"processed 400 rows then stopped", errclass.Unknown},
		{"took 500ms", errclass.Unknown},
		{"cache invalidated", errclass.Unknown},
		{"runtime panic", errclass.Unknown},
		{"", errclass.Unknown},
		{"something went wrong", errclass.Unknown},
	}
	c := errclass.DefaultClassifier()
	for _, tt := range tests {
		t.Run(tt.msg, func(t *testing.T) {
			t.Parallel()
			require.Equal(t, tt.want, c.ClassifyMessage(tt.msg))
		})
	}
}

// timeoutErr is a foreign net.Error, like those of HTTP and RPC clients.
type timeoutErr struct{ timeout bool }

func (e timeoutErr) Error() string   { return "foreign" }
func (e timeoutErr) Timeout() bool   { return e.timeout }
func (e timeoutErr) Temporary() bool { return false }

func refusedDial(t *testing.T) error {
	t.Helper()
	conn, err := net.Dial("tcp", refusedAddr(t))
	if conn != nil {
		conn.Close()
	}
	require.Error(t, err)
	return err
}

func TestClassifyTypes(t *testing.T) {
	t.Parallel()
	expired, cancel := context.WithDeadline(context.Background(), time.Now().Add(-time.Second))
	t.Cleanup(cancel)
	<-expired.Done()

	pipeA, pipeB := net.Pipe()
	t.Cleanup(func() { pipeA.Close(); pipeB.Close() })
	require.NoError(t, pipeA.SetReadDeadline(time.Now().Add(-time.Second)))
	_, readErr := pipeA.Read(make([]byte, 1))
	require.Error(t, readErr)

	refused := refusedDial(t)
	_, httpErr := (&http.Client{}).Get("http://" + refusedAddr(t) + "/")
	require.Error(t, httpErr)

	tests := []struct {
		name string
		err  error
		want errclass.Class
		hint time.Duration
	}{
		{"nil", nil, errclass.Unknown, 0},
		{"context deadline", expired.Err(), errclass.Timeout, 0},
		{"wrapped context deadline", fmt.Errorf("query: %w", context.DeadlineExceeded), errclass.Timeout, 0},
		{"read deadline", readErr, errclass.Timeout, 0},
		{"os deadline", os.ErrDeadlineExceeded, errclass.Timeout, 0},
		{"ETIMEDOUT", &net.OpError{Op: "dial", Net: "tcp", Err: os.NewSyscallError("connect", syscall.ETIMEDOUT)}, errclass.Timeout, 0},
		{"net.Error timeout", fmt.Errorf("rpc: %w", timeoutErr{timeout: true}), errclass.Timeout, 0},
		{"DNS timeout", &net.DNSError{Err: "i/o", Name: "x.example", IsTimeout: true}, errclass.Timeout, 0},
		{"connection refused", refused, errclass.Network, 0},
		{"http client connection refused", httpErr, errclass.Network, 0},
		{"DNS not found", &net.DNSError{Err: "no such host", Name: "x.invalid", IsNotFound: true}, errclass.Network, 0},
		{"foreign net.Error without timeout", timeoutErr{}, errclass.Unknown, 0},
		{"unix socket permission", &net.OpError{Op: "dial", Net: "unix", Err: os.NewSyscallError("connect", syscall.EACCES)}, errclass.Permission, 0},
		{"op error", &net.OpError{Op: "read", Net: "tcp", Err: errors.New("weird")}, errclass.Network, 0},
		{"ECONNRESET", fmt.Errorf("read: %w", syscall.ECONNRESET), errclass.Network, 0},
		{"EPIPE", syscall.EPIPE, errclass.Network, 0},
		{"io.EOF", fmt.Errorf("decode: %w", io.EOF), errclass.Network, 0},
		{"unexpected EOF", io.ErrUnexpectedEOF, errclass.Network, 0},
		{"net.ErrClosed", net.ErrClosed, errclass.Network, 0},
		{"addr error", &net.AddrError{Err: "missing port", Addr: "x"}, errclass.Network, 0},
		{"fs permission", &fs.PathError{Op: "open", Path: "/x", Err: syscall.EACCES}, errclass.Permission, 0},
		{"message fallback", errors.New("upstream said 403 Forbidden"), errclass.Permission, 0},
		{"plain unknown", errors.New("boom"), errclass.Unknown, 0},
		{"typed class wins over type", errclass.Wrap(errclass.RateLimit, context.DeadlineExceeded), errclass.RateLimit, 0},
		{"typed class wins over message", errclass.Wrap(errclass.Temporary, errors.New("invalid state")), errclass.Temporary, 0},
		{"typed hint", errclass.RetryAfter(errclass.New(errclass.RateLimit, "slow"), time.Minute), errclass.RateLimit, time.Minute},
		{"hint without class uses message", errclass.RetryAfter(errors.New("429 Too Many Requests"), 2*time.Second), errclass.RateLimit, 2 * time.Second},
		{"hint without class uses type", errclass.RetryAfter(context.DeadlineExceeded, time.Second), errclass.Timeout, time.Second},
		{"non-retryable keeps class", errclass.NonRetryable(errclass.New(errclass.Timeout, "x")), errclass.Timeout, 0},
		{"custom unrecognised class kept", errclass.New("billing", "card"), errclass.Class("billing"), 0},
	}
	c := errclass.DefaultClassifier()
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			t.Parallel()
			class, hint := c.Classify(tt.err)
			require.Equal(t, tt.want, class)
			require.Equal(t, tt.hint, hint)
		})
	}
}

// refusedAddr is an address nothing listens on: a dial is refused. The
// port is taken from a listener and closed again.
func refusedAddr(t *testing.T) string {
	t.Helper()
	l, err := net.Listen("tcp", "127.0.0.1:0")
	require.NoError(t, err)
	addr := l.Addr().String()
	require.NoError(t, l.Close())
	return addr
}

func TestNewClassifier(t *testing.T) {
	t.Parallel()
	c, err := errclass.NewClassifier(map[errclass.Class][]string{
		errclass.Validation: {`card declined`},
		errclass.Temporary:  {`lock wait`, `deadlock`},
	})
	require.NoError(t, err)
	require.Len(t, c.Patterns, 2, "one pattern per class")
	require.Equal(t, errclass.Temporary, c.Patterns[0].Class, "retryable classes are tried first")
	require.Equal(t, errclass.Validation, c.ClassifyMessage("Card Declined by issuer"))
	require.Equal(t, errclass.Temporary, c.ClassifyMessage("deadlock detected"))
	require.Equal(t, errclass.Temporary, c.ClassifyMessage("card declined: lock wait"))
	require.Equal(t, errclass.Unknown, c.ClassifyMessage("403 Forbidden"), "defaults are replaced, not merged")

	class, _ := c.Classify(context.DeadlineExceeded)
	require.Equal(t, errclass.Timeout, class, "typed errors do not depend on patterns")
}

func TestNewClassifierExtendsDefaults(t *testing.T) {
	t.Parallel()
	patterns := errclass.DefaultPatterns()
	patterns[errclass.Validation] = append(patterns[errclass.Validation], `card declined`)
	c, err := errclass.NewClassifier(patterns)
	require.NoError(t, err)
	require.Equal(t, errclass.Validation, c.ClassifyMessage("card declined"))
	require.Equal(t, errclass.RateLimit, c.ClassifyMessage("429 Too Many Requests"))
	require.Equal(t, errclass.Unknown, errclass.DefaultClassifier().ClassifyMessage("card declined"),
		"changing the returned map does not change the defaults")
}

func TestNewClassifierErrors(t *testing.T) {
	t.Parallel()
	_, err := errclass.NewClassifier(map[errclass.Class][]string{"fatal": {"x"}})
	require.ErrorIs(t, err, errclass.ErrUnknownClass)

	_, err = errclass.NewClassifier(map[errclass.Class][]string{errclass.Network: {"ok", "("}})
	require.ErrorContains(t, err, "network pattern 1")

	_, err = errclass.NewClassifier(map[errclass.Class][]string{errclass.Network: {""}})
	require.ErrorContains(t, err, "network pattern 0 is empty")
}

func TestNilAndEmptyClassifier(t *testing.T) {
	t.Parallel()
	var nilClassifier *errclass.Classifier
	require.Equal(t, errclass.RateLimit, nilClassifier.ClassifyMessage("rate limit"), "nil uses the defaults")
	class, _ := nilClassifier.Classify(errors.New("permission denied"))
	require.Equal(t, errclass.Permission, class)

	empty := &errclass.Classifier{}
	require.Equal(t, errclass.Unknown, empty.ClassifyMessage("rate limit"))
}

func TestDefaultClassifierIsACopy(t *testing.T) {
	t.Parallel()
	a := errclass.DefaultClassifier()
	a.Patterns = a.Patterns[:0]
	a.Patterns = append(a.Patterns, errclass.Pattern{Class: errclass.Validation})
	require.Equal(t, errclass.RateLimit, errclass.DefaultClassifier().ClassifyMessage("rate limit"))
}

func BenchmarkClassifyMessage(b *testing.B) {
	c := errclass.DefaultClassifier()
	for b.Loop() {
		c.ClassifyMessage("something went wrong while processing the job payload")
	}
}
