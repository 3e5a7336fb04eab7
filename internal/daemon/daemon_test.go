package daemon_test

import (
	"testing"

	"github.com/stretchr/testify/require"

	"github.com/retryd/retryd/internal/daemon"
	"github.com/retryd/retryd/internal/envvar"
)

// What is wrong with the shared settings is collected with the binary's
// own, so that one start reports every mistake; once they are right, Env
// holds them. Not parallel: it sets environment variables.
func TestReadEnv(t *testing.T) {
	t.Setenv("RETRYD_AUTH", "off")
	t.Setenv("RETRYD_HTTP_TLS_KEY", "")
	t.Setenv("DATABASE_URL", "")
	t.Setenv("RETRYD_HTTP_TLS_CERT", "cert.pem")
	e := &envvar.Reader{}
	daemon.ReadEnv(e, ":8081")
	err := e.Err()
	require.ErrorContains(t, err, `RETRYD_AUTH=off is only allowed when every listener is loopback, but ":8081" is not`)
	require.ErrorContains(t, err, "RETRYD_HTTP_TLS_CERT is set but RETRYD_HTTP_TLS_KEY is not")
	require.ErrorContains(t, err, "DATABASE_URL is required")

	t.Setenv("DATABASE_URL", "postgres://localhost/retryd")
	t.Setenv("RETRYD_HTTP_TLS_CERT", "")
	e = &envvar.Reader{}
	env := daemon.ReadEnv(e, "127.0.0.1:0")
	require.NoError(t, e.Err())
	require.Equal(t, "postgres://localhost/retryd", env.DatabaseURL)
	require.Nil(t, env.TLS, "plain HTTP without a certificate")
}
