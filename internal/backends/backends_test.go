package backends_test

import (
	"context"
	"testing"

	"github.com/rs/zerolog"
	"github.com/stretchr/testify/require"

	"github.com/retryd/retryd/internal/backends"
	"github.com/retryd/retryd/internal/natsconn"
	"github.com/retryd/retryd/internal/natstest"
	"github.com/retryd/retryd/internal/streams"
	"github.com/retryd/retryd/pkg/contract"
)

func TestOpen(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	srv := natstest.RunServer(t)
	nats := natsconn.Options{URL: srv.ClientURL(), Name: "backends-test"}

	_, err := backends.Open(ctx, backends.Options{NATS: nats}, zerolog.Nop())
	require.ErrorContains(t, err, "DATABASE_URL is required")
	_, err = backends.Open(ctx, backends.Options{DatabaseURL: "postgres://%zz", NATS: nats}, zerolog.Nop())
	require.ErrorContains(t, err, "parse DATABASE_URL")

	// pgxpool connects lazily, so an unreachable database still opens; the
	// pool size and the streams are what Open decides.
	b, err := backends.Open(ctx, backends.Options{
		DatabaseURL:   "postgres://nobody@127.0.0.1:1/none",
		NATS:          nats,
		MinPoolConns:  17,
		EnsureStreams: &streams.Options{},
	}, zerolog.Nop())
	require.NoError(t, err)
	t.Cleanup(b.Close)
	require.EqualValues(t, 17, b.Pool.Config().MaxConns)
	_, err = b.JS.Stream(ctx, contract.StreamRetries)
	require.NoError(t, err, "streams ensured")

	b2, err := backends.Open(ctx, backends.Options{DatabaseURL: "postgres://nobody@127.0.0.1:1/none?pool_max_conns=3",
		NATS: nats, MinPoolConns: 17}, zerolog.Nop())
	require.NoError(t, err)
	t.Cleanup(b2.Close)
	require.EqualValues(t, 3, b2.Pool.Config().MaxConns, "the URL's own pool size wins")
}
