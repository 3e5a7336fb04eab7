package serve_test

import (
	"context"
	"crypto/tls"
	"io"
	"net"
	"net/http"
	"strings"
	"testing"
	"time"

	"github.com/prometheus/client_golang/prometheus"
	"github.com/rs/zerolog"
	"github.com/stretchr/testify/require"

	"github.com/retryd/retryd/internal/serve"
	"github.com/retryd/retryd/internal/serve/servetest"
)

func TestTLSConfigHalfConfigured(t *testing.T) {
	t.Parallel()
	_, err := serve.TLSConfig{CertFile: "cert.pem"}.Server()
	require.ErrorContains(t, err, "RETRYD_HTTP_TLS_KEY is not")
	_, err = serve.TLSConfig{KeyFile: "key.pem"}.Server()
	require.ErrorContains(t, err, "RETRYD_HTTP_TLS_CERT is not")
	cfg, err := serve.TLSConfig{}.Server()
	require.NoError(t, err)
	require.Nil(t, cfg, "neither set: plain HTTP")
	_, err = serve.TLSConfig{CertFile: "/nonexistent/cert.pem", KeyFile: "/nonexistent/key.pem"}.Server()
	require.ErrorContains(t, err, "load RETRYD_HTTP_TLS_CERT and RETRYD_HTTP_TLS_KEY")
}

func TestServeTLS(t *testing.T) {
	t.Parallel()
	cert := servetest.SelfSigned(t)
	tlsCfg, err := serve.TLSConfig{CertFile: cert.CertFile, KeyFile: cert.KeyFile}.Server()
	require.NoError(t, err)
	require.Equal(t, uint16(tls.VersionTLS12), tlsCfg.MinVersion)

	health := &serve.Health{}
	health.SetReady(true)
	guard := serve.Guard{Verifier: tokens{"good": {Name: "ci", Role: serve.RoleViewer}}}
	srv := serve.NewServer("", guard.Handler(serve.NewMux(prometheus.NewRegistry(), health)))
	srv.TLSConfig = tlsCfg
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	require.NoError(t, err)
	ctx, cancel := context.WithCancel(context.Background())
	done := make(chan error, 1)
	go func() { done <- serve.Serve(ctx, srv, ln, zerolog.Nop()) }()
	t.Cleanup(func() {
		cancel()
		require.NoError(t, <-done)
	})
	addr := ln.Addr().String()

	client := &http.Client{Timeout: 5 * time.Second, Transport: &http.Transport{TLSClientConfig: &tls.Config{RootCAs: cert.Pool}}}
	resp, err := client.Get("https://" + addr + "/healthz")
	require.NoError(t, err)
	_ = resp.Body.Close()
	require.Equal(t, http.StatusOK, resp.StatusCode)

	// The session cookie is Secure over TLS.
	resp, err = client.Post("https://"+addr+serve.LoginPath, "application/json", strings.NewReader(`{"token":"good"}`))
	require.NoError(t, err)
	_ = resp.Body.Close()
	require.Equal(t, http.StatusOK, resp.StatusCode)
	require.Len(t, resp.Cookies(), 1)
	require.True(t, resp.Cookies()[0].Secure)

	// Plain HTTP is answered 400 by the TLS server, never served.
	resp, err = http.Get("http://" + addr + "/healthz")
	require.NoError(t, err)
	body, _ := io.ReadAll(resp.Body)
	_ = resp.Body.Close()
	require.Equal(t, http.StatusBadRequest, resp.StatusCode)
	require.Contains(t, string(body), "HTTPS")

	// TLS 1.1 is refused.
	old := &http.Client{Timeout: 5 * time.Second, Transport: &http.Transport{TLSClientConfig: &tls.Config{
		RootCAs: cert.Pool, MinVersion: tls.VersionTLS10, MaxVersion: tls.VersionTLS11}}}
	_, err = old.Get("https://" + addr + "/healthz")
	require.Error(t, err)
}

func TestClientTLS(t *testing.T) {
	t.Parallel()
	cfg, err := serve.ClientTLS("", "")
	require.NoError(t, err)
	require.Nil(t, cfg)
	cert := servetest.SelfSigned(t)
	cfg, err = serve.ClientTLS(cert.CertFile)
	require.NoError(t, err)
	require.NotNil(t, cfg.RootCAs)
	_, err = serve.ClientTLS(cert.KeyFile)
	require.ErrorContains(t, err, "no PEM certificate")
}
