// Package natstest runs an embedded nats-server with JetStream for tests.
//
// Every server listens on a random port, stores its streams under
// t.TempDir() (or a directory the test chooses) and is shut down in
// t.Cleanup, so tests can call t.Parallel() freely:
//
//	srv := natstest.RunServer(t)
//	nc, js := natstest.Connect(t, srv)
//	natstest.EnsureStreams(t, js)
//
// Restart stops a server and starts a new one on the same port and store
// directory, which is how tests simulate a NATS restart; clients from
// Connect reconnect on their own.
//
// Messages reads what a stream holds, and Settled tells whether a
// consumer has nothing left to deliver or to have acknowledged.
package natstest

import (
	"net"
	"sync"
	"testing"
	"time"

	"github.com/nats-io/nats-server/v2/server"
)

// readyTimeout bounds how long a server may take to accept connections.
const readyTimeout = 10 * time.Second

// Option changes the options of an embedded server.
type Option func(*server.Options)

// WithStoreDir stores JetStream data in dir instead of a fresh t.TempDir().
// Two servers started on the same dir, one after the other, see the same
// streams.
func WithStoreDir(dir string) Option {
	return func(o *server.Options) { o.StoreDir = dir }
}

// WithPort listens on a fixed port instead of a random one.
func WithPort(port int) Option {
	return func(o *server.Options) { o.Port = port }
}

// WithSyncInterval sets how often the file store fsyncs (sync_interval in
// the server configuration).
func WithSyncInterval(d time.Duration) Option {
	return func(o *server.Options) { o.SyncInterval = d }
}

// WithSyncAlways makes the file store fsync every write (sync_interval:
// always), for tests that must not lose an acknowledged message when the
// server stops abruptly.
func WithSyncAlways() Option {
	return func(o *server.Options) { o.SyncAlways = true }
}

// WithServerOptions gives full access to the server options, e.g. for
// authentication or TLS.
func WithServerOptions(fn func(*server.Options)) Option {
	return Option(fn)
}

// started remembers how each running server was built so that Restart can
// build the same one again. Entries are removed in t.Cleanup.
var started sync.Map // *server.Server -> startInfo

type startInfo struct {
	opts     []Option
	storeDir string
}

// RunServer starts an embedded nats-server with JetStream on a random port,
// storing in t.TempDir(), waits until it accepts connections and shuts it
// down in t.Cleanup.
func RunServer(t testing.TB, opts ...Option) *server.Server {
	t.Helper()
	o := buildOptions(opts)
	if o.StoreDir == "" {
		o.StoreDir = t.TempDir()
	}
	return start(t, o, startInfo{opts: opts, storeDir: o.StoreDir})
}

// Restart shuts srv down and starts a new server with the same options on
// the same port and store directory. srv must have been started by this
// package. Streams, consumers and messages survive; connections from
// Connect reconnect by themselves.
func Restart(t testing.TB, srv *server.Server) *server.Server {
	t.Helper()
	v, ok := started.Load(srv)
	if !ok {
		t.Fatalf("natstest: Restart of a server not started by natstest.RunServer")
	}
	info := v.(startInfo)
	port := Port(srv)
	srv.Shutdown()
	srv.WaitForShutdown()

	o := buildOptions(info.opts)
	o.StoreDir = info.storeDir
	o.Port = port
	return start(t, o, info)
}

// Port returns the client port srv listens on.
func Port(srv *server.Server) int {
	return srv.Addr().(*net.TCPAddr).Port
}

func buildOptions(opts []Option) *server.Options {
	o := &server.Options{
		Host:      "127.0.0.1",
		Port:      -1,
		JetStream: true,
		NoLog:     true,
		NoSigs:    true,
		// The server reserves each stream's max_bytes against these caps
		// when the stream is created: retryd's streams take 10 GiB
		// (streams.DefaultMaxBytes), also in memory storage. They are
		// caps, not allocations: a server in a test holds little data.
		JetStreamMaxMemory: 16 << 30,
		JetStreamMaxStore:  16 << 30,
	}
	for _, opt := range opts {
		opt(o)
	}
	return o
}

func start(t testing.TB, o *server.Options, info startInfo) *server.Server {
	t.Helper()
	srv, err := server.NewServer(o)
	if err != nil {
		t.Fatalf("natstest: new server: %v", err)
	}
	go srv.Start()
	if !srv.ReadyForConnections(readyTimeout) {
		srv.Shutdown()
		t.Fatalf("natstest: server not ready for connections after %s", readyTimeout)
	}
	started.Store(srv, info)
	t.Cleanup(func() {
		srv.Shutdown()
		srv.WaitForShutdown()
		started.Delete(srv)
	})
	return srv
}
