package main

import (
	"context"
	"fmt"
	"os"
	"time"

	"github.com/nats-io/nats-server/v2/server"
	"github.com/nats-io/nats.go"
	"github.com/nats-io/nats.go/jetstream"
)

// natsSync is the --nats-sync flag: "" or "default" keeps the server's
// sync_interval (2 minutes), "always" fsyncs every write, anything else is
// a duration.
type natsSync string

func (s natsSync) validate() error {
	switch s {
	case "", "default", "always":
		return nil
	}
	if _, err := time.ParseDuration(string(s)); err != nil {
		return fmt.Errorf("--nats-sync must be default, always or a duration, got %q", string(s))
	}
	return nil
}

func (s natsSync) apply(o *server.Options) {
	switch s {
	case "", "default":
	case "always":
		o.SyncAlways = true
	default:
		d, _ := time.ParseDuration(string(s))
		o.SyncInterval = d
	}
}

// String is how the durability line describes it.
func (s natsSync) String() string {
	switch s {
	case "", "default":
		return "sync_interval=2m (server default: writes reach the page cache, fsync every 2 minutes)"
	case "always":
		return "sync_interval=always (fsync every write)"
	}
	return "sync_interval=" + string(s)
}

// natsServer is an embedded nats-server with JetStream on file storage in
// a temporary directory, and a client connected to it. Every system run
// gets a fresh one, so one system's leftovers (1M naked messages, 1M
// schedules) never slow the next.
type natsServer struct {
	srv *server.Server
	dir string
	nc  *nats.Conn
	js  jetstream.JetStream
}

func startNATS(sync natsSync) (*natsServer, error) {
	dir, err := os.MkdirTemp("", "retryd-bench-nats-")
	if err != nil {
		return nil, fmt.Errorf("create nats store: %w", err)
	}
	o := &server.Options{
		Host:               "127.0.0.1",
		Port:               -1,
		JetStream:          true,
		StoreDir:           dir,
		NoLog:              true,
		NoSigs:             true,
		JetStreamMaxMemory: 1 << 30,
		JetStreamMaxStore:  64 << 30,
	}
	sync.apply(o)
	var srv *server.Server
	labelled(context.Background(), compNATS, func(context.Context) {
		if srv, err = server.NewServer(o); err == nil {
			go srv.Start()
		}
	})
	if err != nil {
		_ = os.RemoveAll(dir)
		return nil, fmt.Errorf("new nats server: %w", err)
	}
	if !srv.ReadyForConnections(10 * time.Second) {
		srv.Shutdown()
		_ = os.RemoveAll(dir)
		return nil, fmt.Errorf("nats server not ready")
	}
	n := &natsServer{srv: srv, dir: dir}
	n.nc, n.js, err = n.connect("bench")
	if err != nil {
		n.close()
		return nil, err
	}
	return n, nil
}

// connect opens another connection: publishers and consumers of one
// system get their own, as separate processes would.
func (n *natsServer) connect(name string) (*nats.Conn, jetstream.JetStream, error) {
	nc, err := nats.Connect(n.srv.ClientURL(), nats.Name(name), nats.MaxReconnects(-1))
	if err != nil {
		return nil, nil, fmt.Errorf("connect to nats: %w", err)
	}
	js, err := jetstream.New(nc, jetstream.WithPublishAsyncMaxPending(8192))
	if err != nil {
		nc.Close()
		return nil, nil, fmt.Errorf("new jetstream: %w", err)
	}
	return nc, js, nil
}

// startNATSWith starts a server and creates the one stream a NATS-only
// peer (nak, schedules) runs on.
func startNATSWith(ctx context.Context, sync natsSync, stream jetstream.StreamConfig) (*natsServer, error) {
	ns, err := startNATS(sync)
	if err != nil {
		return nil, err
	}
	if _, err := ns.js.CreateStream(ctx, stream); err != nil {
		ns.close()
		return nil, fmt.Errorf("create stream: %w", err)
	}
	return ns, nil
}

// producer opens a connection of its own for a peer's publisher, as a
// separate producing process would have; closing it drains the
// publisher, then closes the connection.
func (n *natsServer) producer(name string) (*asyncPublisher, func(), error) {
	nc, js, err := n.connect(name)
	if err != nil {
		return nil, nil, err
	}
	pub := newAsyncPublisher(js)
	return pub, func() { pub.close(); nc.Close() }, nil
}

// startNATSPeer is startNATSWith plus a producer connection named
// producer; stop closes both.
func startNATSPeer(ctx context.Context, sync natsSync, stream jetstream.StreamConfig, producer string) (ns *natsServer, pub *asyncPublisher, stop func(), err error) {
	ns, err = startNATSWith(ctx, sync, stream)
	if err != nil {
		return nil, nil, nil, err
	}
	pub, closePub, err := ns.producer(producer)
	if err != nil {
		ns.close()
		return nil, nil, nil, err
	}
	return ns, pub, func() { closePub(); ns.close() }, nil
}

func (n *natsServer) url() string { return n.srv.ClientURL() }

func (n *natsServer) close() {
	if n.nc != nil {
		n.nc.Close()
	}
	n.srv.Shutdown()
	n.srv.WaitForShutdown()
	_ = os.RemoveAll(n.dir)
}
