package main

import (
	"context"
	"net/http"
	"testing"
	"time"

	"github.com/jackc/pgx/v5/pgxpool"
	"github.com/rs/zerolog"
	"github.com/stretchr/testify/require"

	"github.com/retryd/retryd/internal/auth"
	"github.com/retryd/retryd/internal/natstest"
	"github.com/retryd/retryd/internal/serve"
	"github.com/retryd/retryd/migrations/pgtest"
)

// token creates a viewer token in the database at url.
func token(t *testing.T, url, name string) string {
	t.Helper()
	pool, err := pgxpool.New(context.Background(), url)
	require.NoError(t, err)
	defer pool.Close()
	_, secret, err := auth.NewStore(pool).Create(context.Background(), name, serve.RoleViewer, nil)
	require.NoError(t, err)
	return secret
}

// A scheduler shard with a database of its own checks tokens in the home
// shard's (RETRYD_AUTH_DATABASE_URL): a token created there works on it,
// one in its own database does not. Not parallel: it sets the
// environment.
func TestAuthDatabaseURL(t *testing.T) {
	srv := natstest.RunServer(t)
	home, own := pgtest.NewDatabaseURL(t), pgtest.NewDatabaseURL(t)
	addr := freeAddr(t)
	t.Setenv("DATABASE_URL", own)
	t.Setenv("RETRYD_AUTH_DATABASE_URL", home)
	t.Setenv("NATS_URL", srv.ClientURL())
	t.Setenv("RETRYD_HTTP_ADDR", addr)
	t.Setenv("RETRYD_SHARDS", "2")
	t.Setenv("RETRYD_SHARD", "1")
	homeToken, ownToken := token(t, home, "home-viewer"), token(t, own, "own-viewer")

	ctx, cancel := context.WithCancel(context.Background())
	defer cancel()
	done := make(chan error, 1)
	go func() { done <- serveCmd(ctx, zerolog.Nop()) }()
	base := "http://" + addr
	require.Eventually(t, func() bool { code, _ := getAs(t, base+"/readyz", ""); return code == http.StatusOK }, 30*time.Second, 20*time.Millisecond)
	code, body := getAs(t, base+"/v1/retries", homeToken)
	require.Equal(t, http.StatusOK, code, body)
	code, _ = getAs(t, base+"/v1/retries", ownToken)
	require.Equal(t, http.StatusUnauthorized, code)
	cancel()
	requireStopped(t, done)

	t.Setenv("RETRYD_AUTH_DATABASE_URL", "postgres://127.0.0.1:1/none")
	err := serveCmd(context.Background(), zerolog.Nop())
	require.ErrorContains(t, err, "RETRYD_AUTH_DATABASE_URL")
}
