package main

import (
	"crypto/tls"
	"net/http"
	"net/http/httptest"
	"testing"

	"github.com/stretchr/testify/require"

	"github.com/retryd/retryd/internal/serve"
	"github.com/retryd/retryd/internal/serve/servetest"
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
