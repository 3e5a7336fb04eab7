package harness

import (
	"fmt"
	"net/url"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/nats-io/nats-server/v2/server"

	"github.com/retryd/retryd/internal/freeaddr"
)

// Cluster is a JetStream cluster of embedded nats-servers in the test
// process, connected by routes, each with file storage in its own
// directory (sync always).
type Cluster struct {
	Servers []*server.Server
	opts    []*server.Options
}

// NewCluster starts n servers named n1..nN and waits until JetStream has
// a meta leader. They are shut down in t.Cleanup.
func NewCluster(t testing.TB, n int, dir string) *Cluster {
	t.Helper()
	ports := make([]int, n)
	for i := range ports {
		p, err := freeaddr.Port()
		if err != nil {
			t.Fatal(err)
		}
		ports[i] = p
	}
	var routes []*url.URL
	for _, p := range ports {
		routes = append(routes, &url.URL{Scheme: "nats-route", Host: fmt.Sprintf("127.0.0.1:%d", p)})
	}
	c := &Cluster{}
	for i := range n {
		o := &server.Options{
			ServerName: fmt.Sprintf("n%d", i+1),
			Host:       "127.0.0.1", Port: -1,
			JetStream: true, StoreDir: filepath.Join(dir, fmt.Sprintf("n%d", i+1)),
			SyncAlways: true, NoLog: true, NoSigs: true,
			// The store cap holds the streams' reserved max_bytes (10 GiB,
			// streams.DefaultMaxBytes); the data is far smaller.
			JetStreamMaxMemory: 64 << 20, JetStreamMaxStore: 16 << 30,
			Cluster: server.ClusterOpts{Name: "faults", Host: "127.0.0.1", Port: ports[i]},
			Routes:  routes,
		}
		srv, err := server.NewServer(o)
		if err != nil {
			t.Fatalf("cluster server %d: %v", i+1, err)
		}
		go srv.Start()
		c.Servers = append(c.Servers, srv)
		c.opts = append(c.opts, o)
	}
	t.Cleanup(func() {
		for _, s := range c.Servers {
			s.Shutdown()
		}
	})
	for _, s := range c.Servers {
		if !s.ReadyForConnections(20 * time.Second) {
			t.Fatalf("cluster server %s not ready", s.Name())
		}
	}
	// A meta leader alone is not enough: until it has current stats from
	// every peer, an R3 stream is refused ("no suitable peers for
	// placement, peer offline"), which failed scenario 13 at its start.
	deadline := time.Now().Add(60 * time.Second)
	for {
		for _, s := range c.Servers {
			if s.JetStreamIsLeader() && len(s.JetStreamClusterPeers()) == n {
				return c
			}
		}
		if time.Now().After(deadline) {
			t.Fatalf("no JetStream meta leader seeing all %d peers online after 60s", n)
		}
		time.Sleep(50 * time.Millisecond)
	}
}

// URLs is the client URL list of the running servers.
func (c *Cluster) URLs() string {
	var out []string
	for _, s := range c.Servers {
		if s.Running() {
			out = append(out, s.ClientURL())
		}
	}
	return strings.Join(out, ",")
}

// ByName returns the server with that name.
func (c *Cluster) ByName(name string) *server.Server {
	for _, s := range c.Servers {
		if s.Name() == name {
			return s
		}
	}
	return nil
}
