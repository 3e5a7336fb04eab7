package natstest

import (
	"context"
	"testing"
	"time"

	"github.com/nats-io/nats-server/v2/server"
	"github.com/nats-io/nats.go"
	"github.com/nats-io/nats.go/jetstream"

	"github.com/retryd/retryd/internal/streams"
)

// Connect connects to srv and returns the connection and a JetStream
// context; the connection is closed in t.Cleanup. It reconnects forever,
// quickly, so it survives Restart.
func Connect(t testing.TB, srv *server.Server) (*nats.Conn, jetstream.JetStream) {
	t.Helper()
	return ConnectWith(t, srv)
}

// ConnectWith is Connect with extra client options (credentials, TLS,
// handlers); they are applied after the defaults and override them.
func ConnectWith(t testing.TB, srv *server.Server, opts ...nats.Option) (*nats.Conn, jetstream.JetStream) {
	t.Helper()
	base := []nats.Option{
		nats.Name(t.Name()),
		nats.MaxReconnects(-1),
		nats.ReconnectWait(20 * time.Millisecond),
		nats.ReconnectJitter(0, 0),
	}
	nc, err := nats.Connect(srv.ClientURL(), append(base, opts...)...)
	if err != nil {
		t.Fatalf("natstest: connect to %s: %v", srv.ClientURL(), err)
	}
	t.Cleanup(nc.Close)
	js, err := jetstream.New(nc)
	if err != nil {
		t.Fatalf("natstest: new jetstream: %v", err)
	}
	return nc, js
}

// EnsureStreams creates the five retryd streams (streams.Ensure with
// default options: file storage, one replica).
func EnsureStreams(t testing.TB, js jetstream.JetStream) {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	if err := streams.Ensure(ctx, js, streams.Options{}); err != nil {
		t.Fatalf("natstest: ensure streams: %v", err)
	}
}
