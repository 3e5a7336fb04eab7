package natsconn_test

import (
	"bytes"
	"context"
	"crypto/ecdsa"
	"crypto/elliptic"
	"crypto/rand"
	"crypto/x509"
	"crypto/x509/pkix"
	"encoding/pem"
	"math/big"
	"net"
	"os"
	"path/filepath"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/nats-io/jwt/v2"
	"github.com/nats-io/nats-server/v2/server"
	"github.com/nats-io/nats.go"
	"github.com/nats-io/nkeys"
	"github.com/rs/zerolog"
	"github.com/stretchr/testify/require"

	"github.com/retryd/retryd/internal/natsconn"
	"github.com/retryd/retryd/internal/natstest"
	"github.com/retryd/retryd/internal/servicetest"
)

func ctx(t *testing.T) context.Context {
	t.Helper()
	c, cancel := context.WithTimeout(context.Background(), 20*time.Second)
	t.Cleanup(cancel)
	return c
}

// connect connects and checks that JetStream answers.
func connect(t *testing.T, o natsconn.Options, log zerolog.Logger) {
	t.Helper()
	nc, js, err := natsconn.Connect(ctx(t), o, log)
	require.NoError(t, err)
	t.Cleanup(nc.Close)
	_, err = js.AccountInfo(ctx(t))
	require.NoError(t, err)
}

func TestOptionsFromEnv(t *testing.T) {
	// t.Setenv: not parallel.
	for _, k := range []string{"NATS_URL", "NATS_CREDS", "NATS_NKEY", "NATS_USER", "NATS_PASSWORD", "NATS_TOKEN", "NATS_TLS_CERT", "NATS_TLS_KEY", "NATS_TLS_CA", "NATS_INBOX_PREFIX"} {
		t.Setenv(k, "")
	}
	o := natsconn.OptionsFromEnv("svc")
	require.Equal(t, natsconn.Options{URL: "nats://127.0.0.1:4222", Name: "svc"}, o)

	t.Setenv("NATS_URL", "nats://a:4222,nats://b:4222")
	t.Setenv("NATS_CREDS", "/c")
	t.Setenv("NATS_NKEY", "/n")
	t.Setenv("NATS_USER", "u")
	t.Setenv("NATS_PASSWORD", "p")
	t.Setenv("NATS_TOKEN", "tok")
	t.Setenv("NATS_TLS_CERT", "/cert")
	t.Setenv("NATS_TLS_KEY", "/key")
	t.Setenv("NATS_TLS_CA", "/ca")
	t.Setenv("NATS_INBOX_PREFIX", "_INBOX_svc")
	require.Equal(t, natsconn.Options{
		URL: "nats://a:4222,nats://b:4222", Name: "svc", CredsFile: "/c", NKeyFile: "/n",
		User: "u", Password: "p", Token: "tok", TLSCert: "/cert", TLSKey: "/key", TLSCA: "/ca",
		InboxPrefix: "_INBOX_svc",
	}, natsconn.OptionsFromEnv("svc"))
}

func TestConnectUserPassword(t *testing.T) {
	t.Parallel()
	srv := natstest.RunServer(t, natstest.WithServerOptions(func(o *server.Options) {
		o.Username = "retryd"
		o.Password = "s3cret-pass"
	}))
	var logs bytes.Buffer
	log := zerolog.New(&logs)
	connect(t, natsconn.Options{URL: srv.ClientURL(), Name: "test", User: "retryd", Password: "s3cret-pass"}, log)
	require.Contains(t, logs.String(), "nats connected")

	// A wrong password is not retried: it fails at once, with the cause.
	start := time.Now()
	_, _, err := natsconn.Connect(ctx(t), natsconn.Options{URL: srv.ClientURL(), User: "retryd", Password: "wrong-pass"}, log)
	require.ErrorIs(t, err, nats.ErrAuthorization)
	require.Less(t, time.Since(start), 10*time.Second)
	require.NotContains(t, err.Error(), "wrong-pass")
	require.NotContains(t, logs.String(), "s3cret-pass")
	require.NotContains(t, logs.String(), "wrong-pass")
}

func TestConnectToken(t *testing.T) {
	t.Parallel()
	srv := natstest.RunServer(t, natstest.WithServerOptions(func(o *server.Options) { o.Authorization = "tok-123" }))
	connect(t, natsconn.Options{URL: srv.ClientURL(), Token: "tok-123"}, zerolog.Nop())
	_, _, err := natsconn.Connect(ctx(t), natsconn.Options{URL: srv.ClientURL(), Token: "nope"}, zerolog.Nop())
	require.ErrorIs(t, err, nats.ErrAuthorization)
}

func TestConnectNKey(t *testing.T) {
	t.Parallel()
	kp, err := nkeys.CreateUser()
	require.NoError(t, err)
	pub, err := kp.PublicKey()
	require.NoError(t, err)
	seed, err := kp.Seed()
	require.NoError(t, err)
	seedFile := filepath.Join(t.TempDir(), "user.nk")
	require.NoError(t, os.WriteFile(seedFile, seed, 0o600))

	srv := natstest.RunServer(t, natstest.WithServerOptions(func(o *server.Options) {
		o.Nkeys = []*server.NkeyUser{{Nkey: pub}}
	}))
	connect(t, natsconn.Options{URL: srv.ClientURL(), NKeyFile: seedFile}, zerolog.Nop())
}

func TestConnectTLS(t *testing.T) {
	t.Parallel()
	pki := newPKI(t)
	tlsCfg, err := server.GenTLSConfig(&server.TLSConfigOpts{CertFile: pki.serverCert, KeyFile: pki.serverKey, CaFile: pki.ca, Verify: true})
	require.NoError(t, err)
	srv := natstest.RunServer(t, natstest.WithServerOptions(func(o *server.Options) {
		o.TLSConfig = tlsCfg
		o.TLS = true
		o.TLSVerify = true
		o.TLSTimeout = 5
	}))
	url := "tls://127.0.0.1:" + itoa(natstest.Port(srv))

	connect(t, natsconn.Options{URL: url, TLSCA: pki.ca, TLSCert: pki.clientCert, TLSKey: pki.clientKey}, zerolog.Nop())

	// Without the CA the server certificate is not trusted: no retrying.
	_, _, err = natsconn.Connect(ctx(t), natsconn.Options{URL: url, TLSCert: pki.clientCert, TLSKey: pki.clientKey}, zerolog.Nop())
	require.ErrorContains(t, err, "certificate")

	// Without a client certificate the server refuses the connection.
	c, cancel := context.WithTimeout(context.Background(), time.Second)
	defer cancel()
	_, _, err = natsconn.Connect(c, natsconn.Options{URL: url, TLSCA: pki.ca}, zerolog.Nop())
	require.Error(t, err)
}

func TestValidateNamesTheOption(t *testing.T) {
	t.Parallel()
	dir := t.TempDir()
	garbage := filepath.Join(dir, "garbage.creds")
	require.NoError(t, os.WriteFile(garbage, []byte("not a creds file\n"), 0o600))
	notPEM := filepath.Join(dir, "ca.pem")
	require.NoError(t, os.WriteFile(notPEM, []byte("nope"), 0o600))

	tests := []struct {
		name string
		o    natsconn.Options
		want string
	}{
		{"no url", natsconn.Options{}, "Options.URL (NATS_URL) is required"},
		{"missing creds", natsconn.Options{URL: "nats://x", CredsFile: filepath.Join(dir, "missing.creds")}, "Options.CredsFile (NATS_CREDS) " + filepath.Join(dir, "missing.creds") + ": open"},
		{"garbage creds", natsconn.Options{URL: "nats://x", CredsFile: garbage}, "no user JWT found (is it a .creds file?)"},
		{"missing nkey", natsconn.Options{URL: "nats://x", NKeyFile: filepath.Join(dir, "missing.nk")}, "Options.NKeyFile (NATS_NKEY)"},
		{"two auth methods", natsconn.Options{URL: "nats://x", User: "u", Password: "p", Token: "t"}, "set only one of"},
		{"user without password", natsconn.Options{URL: "nats://x", User: "u"}, "go together"},
		{"cert without key", natsconn.Options{URL: "nats://x", TLSCert: "/c"}, "Options.TLSCert (NATS_TLS_CERT) and Options.TLSKey"},
		{"ca not pem", natsconn.Options{URL: "nats://x", TLSCA: notPEM}, "no PEM certificate found"},
		{"ca missing", natsconn.Options{URL: "nats://x", TLSCA: filepath.Join(dir, "nope.pem")}, "Options.TLSCA (NATS_TLS_CA)"},
		{"inbox wildcard", natsconn.Options{URL: "nats://x", InboxPrefix: "_INBOX_*"}, "Options.InboxPrefix (NATS_INBOX_PREFIX)"},
		{"inbox trailing dot", natsconn.Options{URL: "nats://x", InboxPrefix: "_INBOX_a."}, "must be a subject without wildcards"},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			t.Parallel()
			require.ErrorContains(t, tc.o.Validate(), tc.want)
			_, _, err := natsconn.Connect(context.Background(), tc.o, zerolog.Nop())
			require.ErrorContains(t, err, tc.want)
		})
	}
}

func TestValidateAcceptsCredsFile(t *testing.T) {
	t.Parallel()
	account, err := nkeys.CreateAccount()
	require.NoError(t, err)
	user, err := nkeys.CreateUser()
	require.NoError(t, err)
	upub, err := user.PublicKey()
	require.NoError(t, err)
	token, err := jwt.NewUserClaims(upub).Encode(account)
	require.NoError(t, err)
	seed, err := user.Seed()
	require.NoError(t, err)
	creds, err := jwt.FormatUserConfig(token, seed)
	require.NoError(t, err)
	path := filepath.Join(t.TempDir(), "user.creds")
	require.NoError(t, os.WriteFile(path, creds, 0o600))
	require.NoError(t, natsconn.Options{URL: "nats://x", CredsFile: path}.Validate())
}

// Connect waits for a server that is not up yet, then connects.
func TestConnectWaitsForServer(t *testing.T) {
	t.Parallel()
	port := freePort(t)
	logs := &servicetest.Buffer{}
	type result struct {
		nc  *nats.Conn
		err error
	}
	done := make(chan result, 1)
	go func() {
		nc, _, err := natsconn.Connect(ctx(t), natsconn.Options{URL: "nats://user:pw-in-url@127.0.0.1:" + itoa(port)}, zerolog.New(logs))
		done <- result{nc, err}
	}()
	// Give Connect a chance to fail at least once before the server exists.
	require.Eventually(t, func() bool { return logs.String() != "" }, 10*time.Second, 10*time.Millisecond)
	srv := natstest.RunServer(t, natstest.WithPort(port), natstest.WithServerOptions(func(o *server.Options) {
		o.Username, o.Password = "user", "pw-in-url"
	}))
	r := <-done
	require.NoError(t, r.err)
	defer r.nc.Close()
	require.True(t, r.nc.IsConnected())
	require.Equal(t, srv.ID(), r.nc.ConnectedServerId())
	require.Contains(t, logs.String(), "nats not reachable, retrying")
	require.NotContains(t, logs.String(), "pw-in-url")
}

func TestConnectGivesUpWithContext(t *testing.T) {
	t.Parallel()
	c, cancel := context.WithTimeout(context.Background(), 300*time.Millisecond)
	defer cancel()
	_, _, err := natsconn.Connect(c, natsconn.Options{URL: "nats://127.0.0.1:" + itoa(freePort(t))}, zerolog.Nop())
	require.ErrorIs(t, err, context.DeadlineExceeded)
	require.ErrorIs(t, err, nats.ErrNoServers)
}

func TestRedactURL(t *testing.T) {
	t.Parallel()
	require.Equal(t, "nats://redacted@a:4222,nats://b:4222", natsconn.RedactURL("nats://u:p@a:4222, nats://b:4222"))
	require.Equal(t, "redacted@host:4222", natsconn.RedactURL("tok@host:4222"))
	require.Equal(t, "nats://127.0.0.1:4222", natsconn.RedactURL("nats://127.0.0.1:4222"))
}

// Reconnects are logged, without secrets.
func TestLogsDisconnectAndReconnect(t *testing.T) {
	t.Parallel()
	srv := natstest.RunServer(t, natstest.WithServerOptions(func(o *server.Options) {
		o.Username, o.Password = "u", "hunter2-pass"
	}))
	w := &servicetest.Buffer{}
	nc, _, err := natsconn.Connect(ctx(t), natsconn.Options{URL: srv.ClientURL(), User: "u", Password: "hunter2-pass"}, zerolog.New(w))
	require.NoError(t, err)
	defer nc.Close()
	natstest.Restart(t, srv)
	require.Eventually(t, func() bool { return strings.Contains(w.String(), "nats reconnected") }, 20*time.Second, 20*time.Millisecond)
	require.Contains(t, w.String(), "nats disconnected, reconnecting")
	require.NotContains(t, w.String(), "hunter2-pass")
}

func itoa(n int) string { return strconv.Itoa(n) }

func freePort(t *testing.T) int {
	t.Helper()
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	require.NoError(t, err)
	port := ln.Addr().(*net.TCPAddr).Port
	require.NoError(t, ln.Close())
	return port
}

type pki struct {
	ca, serverCert, serverKey, clientCert, clientKey string
}

// newPKI writes a self-signed CA, a server certificate for 127.0.0.1 and a
// client certificate, all signed by the CA.
func newPKI(t *testing.T) pki {
	t.Helper()
	dir := t.TempDir()
	caKey, err := ecdsa.GenerateKey(elliptic.P256(), rand.Reader)
	require.NoError(t, err)
	caTmpl := &x509.Certificate{
		SerialNumber:          big.NewInt(1),
		Subject:               pkix.Name{CommonName: "retryd test CA"},
		NotBefore:             time.Now().Add(-time.Hour),
		NotAfter:              time.Now().Add(time.Hour),
		IsCA:                  true,
		KeyUsage:              x509.KeyUsageCertSign | x509.KeyUsageDigitalSignature,
		BasicConstraintsValid: true,
	}
	caDER, err := x509.CreateCertificate(rand.Reader, caTmpl, caTmpl, &caKey.PublicKey, caKey)
	require.NoError(t, err)
	caCert, err := x509.ParseCertificate(caDER)
	require.NoError(t, err)

	issue := func(name string, serial int64, usage x509.ExtKeyUsage, ips []net.IP) (string, string) {
		key, err := ecdsa.GenerateKey(elliptic.P256(), rand.Reader)
		require.NoError(t, err)
		tmpl := &x509.Certificate{
			SerialNumber: big.NewInt(serial),
			Subject:      pkix.Name{CommonName: name},
			NotBefore:    time.Now().Add(-time.Hour),
			NotAfter:     time.Now().Add(time.Hour),
			KeyUsage:     x509.KeyUsageDigitalSignature,
			ExtKeyUsage:  []x509.ExtKeyUsage{usage},
			IPAddresses:  ips,
		}
		der, err := x509.CreateCertificate(rand.Reader, tmpl, caCert, &key.PublicKey, caKey)
		require.NoError(t, err)
		keyDER, err := x509.MarshalECPrivateKey(key)
		require.NoError(t, err)
		certFile := filepath.Join(dir, name+".pem")
		keyFile := filepath.Join(dir, name+"-key.pem")
		writePEM(t, certFile, "CERTIFICATE", der)
		writePEM(t, keyFile, "EC PRIVATE KEY", keyDER)
		return certFile, keyFile
	}
	p := pki{ca: filepath.Join(dir, "ca.pem")}
	writePEM(t, p.ca, "CERTIFICATE", caDER)
	p.serverCert, p.serverKey = issue("server", 2, x509.ExtKeyUsageServerAuth, []net.IP{net.ParseIP("127.0.0.1")})
	p.clientCert, p.clientKey = issue("client", 3, x509.ExtKeyUsageClientAuth, nil)
	return p
}

func writePEM(t *testing.T, path, typ string, der []byte) {
	t.Helper()
	require.NoError(t, os.WriteFile(path, pem.EncodeToMemory(&pem.Block{Type: typ, Bytes: der}), 0o600))
}
