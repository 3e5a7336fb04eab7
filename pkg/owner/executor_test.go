package owner

import (
	"errors"
	"strings"
	"testing"

	"github.com/stretchr/testify/require"

	"github.com/retryd/retryd/pkg/contract"
)

// The default executor keeps the pid whole, so that two processes on one
// host stay apart, and fits the contract whatever the host name is.
func TestDefaultExecutorID(t *testing.T) {
	t.Parallel()
	host := func(name string, err error) func() (string, error) {
		return func() (string, error) { return name, err }
	}
	for _, tc := range []struct {
		name     string
		hostname func() (string, error)
		want     string
	}{
		{"host and pid", host("worker-7f9c", nil), "worker-7f9c-4242"},
		{"no host name", host("", errors.New("no uts")), "unknown-4242"},
		{"long host name loses its end, not the pid", host(strings.Repeat("h", 80), nil), strings.Repeat("h", contract.MaxTokenLen-5) + "-4242"},
		{"cut at a rune boundary", host(strings.Repeat("é", 40), nil), strings.Repeat("é", 29) + "-4242"},
		{"unprintable characters replaced", host("bad\x00host\n", nil), "bad_host_-4242"},
	} {
		got := DefaultExecutorID(tc.hostname, 4242)
		require.Equal(t, tc.want, got, tc.name)
		require.NoError(t, contract.ValidateExecutor("executor", got), tc.name)
		require.LessOrEqual(t, len(got), contract.MaxTokenLen, tc.name)
	}
}
