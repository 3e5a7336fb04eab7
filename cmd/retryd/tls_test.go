package main

import (
	"context"
	"crypto/tls"
	"net/http"
	"net/http/httptest"
	"strings"
	"testing"
	"time"

	"github.com/stretchr/testify/require"

	"github.com/retryd/retryd/cmd/retryd/internal/devstack"
	"github.com/retryd/retryd/internal/serve"
	"github.com/retryd/retryd/internal/serve/servetest"
	"github.com/retryd/retryd/migrations/pgtest"
)

// TestCLICAFile: the CLI trusts a private CA given by --ca-file, and
// refuses the server's certificate without it.
func TestCLICAFile(t *testing.T) {
	t.Parallel()
	cert := servetest.SelfSigned(t)
	tlsCfg, err := serve.TLSConfig{CertFile: cert.CertFile, KeyFile: cert.KeyFile}.Server()
	require.NoError(t, err)
	srv := httptest.NewUnstartedServer(http.HandlerFunc(func(w http.ResponseWriter, _ *http.Request) {
		serve.WriteJSON(w, http.StatusOK, map[string]any{"retries": []any{}})
	}))
	srv.TLS = tlsCfg.Clone()
	srv.TLS.MinVersion = tls.VersionTLS12
	srv.StartTLS()
	t.Cleanup(srv.Close)

	r := cli(t, "--api", srv.URL, "--ca-file", cert.CertFile, "retries", "list")
	require.Equal(t, exitOK, r.code, r.stderr)
	require.Contains(t, r.stdout, "No retries match.")

	r = cli(t, "--api", srv.URL, "retries", "list")
	require.NotEqual(t, exitOK, r.code)
	require.Contains(t, r.stderr, "certificate")

	r = cli(t, "--api", srv.URL, "--ca-file", cert.KeyFile, "retries", "list")
	require.Equal(t, exitUsage, r.code, r.stderr)
	require.Contains(t, r.stderr, "--ca-file")
}

// Half a TLS configuration stops retryd dev and the gateway before they
// listen, naming the missing variable. Not parallel: it sets the
// environment.
func TestHalfTLSConfigRefused(t *testing.T) {
	t.Setenv(serve.EnvTLSCert, "cert.pem")
	for _, args := range [][]string{
		{"dev", "--data-dir", t.TempDir()},
		{"gateway", "--listen", "127.0.0.1:0", "--database-url", "postgres://127.0.0.1:1/none"},
	} {
		r := cli(t, args...)
		require.Equal(t, exitUsage, r.code, "%v: %s", args, r.stderr)
		require.Contains(t, r.stderr, "RETRYD_HTTP_TLS_CERT is set but RETRYD_HTTP_TLS_KEY is not", args)
	}
}

// retryd dev with a certificate serves HTTPS only: its URL says https, the
// CLI reaches it with --ca-file, plain HTTP is refused.
func TestDevServesHTTPS(t *testing.T) {
	t.Parallel()
	cert := servetest.SelfSigned(t)
	ctx, cancel := context.WithTimeout(context.Background(), 2*time.Minute)
	t.Cleanup(cancel)
	stack := startStack(ctx, t, devstack.Config{
		DataDir: t.TempDir(), HTTPAddr: "127.0.0.1:0", NATSPort: -1,
		DatabaseURL: pgtest.NewDatabaseURL(t), Logger: testLogger(t),
		TLS: serve.TLSConfig{CertFile: cert.CertFile, KeyFile: cert.KeyFile},
	})
	require.True(t, strings.HasPrefix(stack.URL(), "https://"), stack.URL())

	r := cli(t, "--ca-file", cert.CertFile, "probe", stack.URL()+"/healthz")
	require.Equal(t, exitOK, r.code, r.stderr)
	r = cli(t, "--api", stack.URL(), "--ca-file", cert.CertFile, "retries", "list")
	require.Equal(t, exitOK, r.code, r.stderr)
	resp, err := http.Get("http://" + strings.TrimPrefix(stack.URL(), "https://") + "/healthz")
	require.NoError(t, err)
	_ = resp.Body.Close()
	require.Equal(t, http.StatusBadRequest, resp.StatusCode, "plain HTTP is not served")
}
