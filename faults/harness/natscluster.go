package harness

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"net/http"
	"path/filepath"
	"slices"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/nats-io/nats.go"
	"github.com/nats-io/nats.go/jetstream"

	"github.com/retryd/retryd/internal/freeaddr"
)

// NATSCluster is a JetStream cluster of nats-server processes (the binary
// the suite builds) named n1..nN, each with its own config, port and
// store directory (sync_interval: always), connected by routes that go
// through one routeProxy per ordered pair of nodes, so that a node can be
// cut off while it runs (Partition) as well as stopped.
type NATSCluster struct {
	Nodes []*NATSServer
	Names []string
	// proxies[i][j] carries the routes node i solicits to node j.
	proxies [][]*routeProxy
	sink    *routeProxy
	monitor []int
	dir     string
	nc      *nats.Conn
	js      jetstream.JetStream
	// via holds a connection to each node alone, to ask what the nodes on
	// one side of a partition see.
	via map[string]jetstream.JetStream
}

// NewNATSCluster starts an n-node cluster and waits until an R<n> stream
// can be placed (see WaitPlacement). Everything is stopped in t.Cleanup;
// the node logs stay in the cluster's directory when the test fails or
// RETRYD_FAULTS_KEEP is set.
func NewNATSCluster(t testing.TB, ctx context.Context, n int) *NATSCluster {
	t.Helper()
	bins, dir := start(t, ctx, "retryd-faults-cluster-")
	var err error
	c := &NATSCluster{dir: dir, via: map[string]jetstream.JetStream{}}
	t.Cleanup(func() {
		c.close()
		keepOrRemove(t, dir, "cluster logs")
	})
	if err := c.build(bins, n); err != nil {
		t.Fatalf("nats cluster: %v", err)
	}
	for i := range c.Nodes {
		if err := c.startFirst(ctx, bins, i); err != nil {
			t.Fatalf("nats cluster: %v", err)
		}
	}
	c.nc, err = nats.Connect(c.URLs(), nats.Name("faults-cluster-admin"), nats.MaxReconnects(-1),
		nats.ReconnectWait(50*time.Millisecond))
	if err != nil {
		t.Fatalf("connect nats cluster: %v", err)
	}
	if c.js, err = jetstream.New(c.nc); err != nil {
		t.Fatalf("jetstream: %v", err)
	}
	wctx, cancel := context.WithTimeout(ctx, 60*time.Second)
	defer cancel()
	if err := c.WaitPlacement(wctx); err != nil {
		t.Fatalf("nats cluster: %v", err)
	}
	return c
}

func (c *NATSCluster) build(bins *Binaries, n int) error {
	// Every node advertises the sink, which accepts and closes: a node
	// told of a peer by gossip tries that address once (an implicit route
	// is not retried) and so never routes around the proxies.
	var err error
	if c.sink, err = newRouteProxy(""); err != nil {
		return err
	}
	c.sink.Cut()
	c.proxies = make([][]*routeProxy, n)
	for i := range n {
		c.proxies[i] = make([]*routeProxy, n)
		for j := range n {
			if i == j {
				continue
			}
			// The target is set when node j is configured.
			if c.proxies[i][j], err = newRouteProxy(""); err != nil {
				return err
			}
		}
	}
	c.Nodes = make([]*NATSServer, n)
	c.monitor = make([]int, n)
	for i := range n {
		c.Names = append(c.Names, fmt.Sprintf("n%d", i+1))
		if err := c.configure(bins, i); err != nil {
			return err
		}
	}
	return nil
}

// configure writes node i's config on free ports (client, monitoring,
// cluster) and points the proxies of the routes to it at its cluster port.
func (c *NATSCluster) configure(bins *Binaries, i int) error {
	clusterPort, err := freeaddr.Port()
	if err != nil {
		return err
	}
	if c.monitor[i], err = freeaddr.Port(); err != nil {
		return err
	}
	var routes []string
	for j := range c.Nodes {
		if j != i {
			routes = append(routes, strconv.Quote("nats-route://"+c.proxies[i][j].Addr()))
			c.proxies[j][i].setTarget("127.0.0.1:" + strconv.Itoa(clusterPort))
		}
	}
	extra := fmt.Sprintf(`http: 127.0.0.1:%d
cluster {
  name: faults
  listen: 127.0.0.1:%d
  advertise: %q
  routes: [%s]
}
`, c.monitor[i], clusterPort, c.sink.Addr(), strings.Join(routes, ", "))
	c.Nodes[i], err = NewNATSServer(bins, filepath.Join(c.dir, c.Names[i]), NATSConfig{Name: c.Names[i], Extra: extra})
	return err
}

// startFirst starts node i for the first time. A port freeaddr found free
// can be taken by another process before nats-server binds it (the
// scenarios run in parallel, and a cut route reconnects many times a
// second): the node then exits, and is configured again on new ports.
// Later starts keep the client port the services were given.
func (c *NATSCluster) startFirst(ctx context.Context, bins *Binaries, i int) error {
	var err error
	for attempt := range 3 {
		if attempt > 0 {
			if err = c.configure(bins, i); err != nil {
				return err
			}
		}
		if err = c.StartNode(ctx, c.Names[i]); err == nil || !strings.Contains(Tail(c.Nodes[i].LogPath, 2000), "address already in use") {
			return err
		}
	}
	return err
}

// StartNode starts node name and waits until its monitoring endpoint
// answers with its name: a listening client port alone may belong to
// another process, when the node could not bind it and exited.
func (c *NATSCluster) StartNode(ctx context.Context, name string) error {
	i := slices.Index(c.Names, name)
	if i < 0 {
		return fmt.Errorf("no cluster node %q", name)
	}
	node := c.Nodes[i]
	if err := node.StartReady(ctx); err != nil {
		return err
	}
	client := &http.Client{Timeout: time.Second}
	url := fmt.Sprintf("http://127.0.0.1:%d/varz", c.monitor[i])
	for {
		if !node.Running() {
			return fmt.Errorf("nats-server %s exited:\n%s", name, Tail(node.LogPath, 3000))
		}
		req, err := http.NewRequestWithContext(ctx, http.MethodGet, url, nil)
		if err != nil {
			return err
		}
		if resp, err := client.Do(req); err == nil {
			var varz struct {
				Name string `json:"server_name"`
			}
			err = json.NewDecoder(resp.Body).Decode(&varz)
			resp.Body.Close()
			if err == nil && varz.Name == name {
				return nil
			}
		}
		select {
		case <-ctx.Done():
			return fmt.Errorf("nats-server %s: no answer from its monitoring port %s: %w", name, url, ctx.Err())
		case <-time.After(25 * time.Millisecond):
		}
	}
}

func (c *NATSCluster) close() {
	if c.nc != nil {
		c.nc.Close()
	}
	for _, js := range c.via {
		js.Conn().Close()
	}
	for _, s := range c.Nodes {
		if s != nil {
			_ = s.Thaw()
			_ = s.Kill9()
		}
	}
	for _, row := range c.proxies {
		for _, p := range row {
			if p != nil {
				p.Close()
			}
		}
	}
	if c.sink != nil {
		c.sink.Close()
	}
}

// URLs is the client URL list of every node, running or not: clients
// given it reconnect to whichever node is up.
func (c *NATSCluster) URLs() string {
	out := make([]string, len(c.Nodes))
	for i, s := range c.Nodes {
		out[i] = s.URL()
	}
	return strings.Join(out, ",")
}

// Node returns the node named name (n1..nN), nil if there is none.
func (c *NATSCluster) Node(name string) *NATSServer {
	for i, n := range c.Names {
		if n == name {
			return c.Nodes[i]
		}
	}
	return nil
}

// Partition cuts node name off from the others: every route between it
// and them is closed and refused until Heal; the node keeps running and
// keeps its client connections.
func (c *NATSCluster) Partition(name string) error {
	return c.routes(name, (*routeProxy).Cut)
}

// Heal lets node name's routes through again.
func (c *NATSCluster) Heal(name string) error {
	return c.routes(name, (*routeProxy).Heal)
}

func (c *NATSCluster) routes(name string, f func(*routeProxy)) error {
	k := -1
	for i, n := range c.Names {
		if n == name {
			k = i
		}
	}
	if k < 0 {
		return fmt.Errorf("no cluster node %q", name)
	}
	for j := range c.Nodes {
		if j != k {
			f(c.proxies[k][j])
			f(c.proxies[j][k])
		}
	}
	return nil
}

// WaitPlacement waits until the meta leader can place a stream on every
// node: it creates (and deletes) a probe stream with one replica per
// node until that succeeds. A meta leader alone is not enough: until it
// has current stats from every peer, an R3 stream is refused ("no
// suitable peers for placement, peer offline"), which failed scenario 13
// at its start.
func (c *NATSCluster) WaitPlacement(ctx context.Context) error {
	const probe = "FAULTS_CLUSTER_PROBE"
	var last error
	for {
		cctx, cancel := context.WithTimeout(ctx, 5*time.Second)
		_, err := c.js.CreateOrUpdateStream(cctx, jetstream.StreamConfig{
			Name: probe, Subjects: []string{"faults.cluster.probe"}, Storage: jetstream.MemoryStorage,
			Replicas: len(c.Nodes), MaxMsgs: 1,
		})
		if err == nil {
			err = c.js.DeleteStream(cctx, probe)
		}
		cancel()
		if err == nil {
			return nil
		}
		last = err
		select {
		case <-ctx.Done():
			return fmt.Errorf("no stream with %d replicas could be placed: %w (last error: %w)", len(c.Nodes), ctx.Err(), last)
		case <-time.After(100 * time.Millisecond):
		}
	}
}

// StreamLeader returns the name of the node leading stream, "" while it
// has none, as node via sees it (any node when via is ""): a node cut
// off by Partition may still call itself the leader for a while.
func (c *NATSCluster) StreamLeader(ctx context.Context, stream, via string) (string, error) {
	js := c.js
	if via != "" {
		var err error
		if js, err = c.connVia(via); err != nil {
			return "", err
		}
	}
	cctx, cancel := context.WithTimeout(ctx, 3*time.Second)
	defer cancel()
	st, err := js.Stream(cctx, stream)
	if err != nil {
		return "", fmt.Errorf("stream %s: %w", stream, err)
	}
	info := st.CachedInfo()
	if info.Cluster == nil {
		return "", fmt.Errorf("stream %s has no cluster info", stream)
	}
	return info.Cluster.Leader, nil
}

// Clients lists the names of the client connections each running node
// holds (from its monitoring endpoint, /connz), e.g. to tell which node
// the scheduler is on when one is cut off.
func (c *NATSCluster) Clients(ctx context.Context) map[string][]string {
	out := map[string][]string{}
	client := &http.Client{Timeout: 2 * time.Second}
	for i, node := range c.Nodes {
		if !node.Running() {
			continue
		}
		req, err := http.NewRequestWithContext(ctx, http.MethodGet,
			fmt.Sprintf("http://127.0.0.1:%d/connz?limit=1024", c.monitor[i]), nil)
		if err != nil {
			continue
		}
		resp, err := client.Do(req)
		if err != nil {
			continue
		}
		var connz struct {
			Connections []struct {
				Name string `json:"name"`
			} `json:"connections"`
		}
		err = json.NewDecoder(resp.Body).Decode(&connz)
		resp.Body.Close()
		if err != nil {
			continue
		}
		for _, cn := range connz.Connections {
			out[c.Names[i]] = append(out[c.Names[i]], cn.Name)
		}
		slices.Sort(out[c.Names[i]])
	}
	return out
}

// MoveLeader makes node preferred the leader of stream: it asks the
// current leader to step down in its favour (a stepdown request with a
// preferred placement) until preferred leads, or ctx ends.
func (c *NATSCluster) MoveLeader(ctx context.Context, stream, preferred string) error {
	body, err := json.Marshal(map[string]any{"placement": map[string]string{"preferred": preferred}})
	if err != nil {
		return fmt.Errorf("encode stepdown: %w", err)
	}
	var last error
	for {
		leader, err := c.StreamLeader(ctx, stream, "")
		if err == nil && leader == preferred {
			return nil
		}
		if err == nil && leader != "" {
			rctx, cancel := context.WithTimeout(ctx, 3*time.Second)
			msg, rerr := c.nc.RequestWithContext(rctx, "$JS.API.STREAM.LEADER.STEPDOWN."+stream, body)
			cancel()
			if rerr == nil {
				var resp struct {
					Error *struct {
						Description string `json:"description"`
					} `json:"error"`
				}
				if json.Unmarshal(msg.Data, &resp) == nil && resp.Error != nil {
					rerr = errors.New(resp.Error.Description)
				}
			}
			last = rerr
		} else {
			last = err
		}
		select {
		case <-ctx.Done():
			return fmt.Errorf("move the leader of %s to %s: %w (last error: %v)", stream, preferred, ctx.Err(), last)
		case <-time.After(500 * time.Millisecond):
		}
	}
}

func (c *NATSCluster) connVia(name string) (jetstream.JetStream, error) {
	if js, ok := c.via[name]; ok {
		return js, nil
	}
	node := c.Node(name)
	if node == nil {
		return nil, fmt.Errorf("no cluster node %q", name)
	}
	nc, err := nats.Connect(node.URL(), nats.Name("faults-cluster-via-"+name), nats.MaxReconnects(-1),
		nats.ReconnectWait(50*time.Millisecond), nats.RetryOnFailedConnect(true))
	if err != nil {
		return nil, fmt.Errorf("connect to %s: %w", name, err)
	}
	js, err := jetstream.New(nc)
	if err != nil {
		nc.Close()
		return nil, fmt.Errorf("jetstream via %s: %w", name, err)
	}
	c.via[name] = js
	return js, nil
}

func (c *NATSCluster) streamInfo(ctx context.Context, stream string) (*jetstream.StreamInfo, error) {
	cctx, cancel := context.WithTimeout(ctx, 3*time.Second)
	defer cancel()
	st, err := c.js.Stream(cctx, stream)
	if err != nil {
		return nil, fmt.Errorf("stream %s: %w", stream, err)
	}
	return st.CachedInfo(), nil
}

// WaitCurrent waits until every stream named has a leader and every other
// node is a current replica (seen recently and caught up with the
// leader's log, as nats-server counts it), so that losing any one node
// next leaves a quorum that holds every acknowledged message.
func (c *NATSCluster) WaitCurrent(ctx context.Context, streams ...string) error {
	var why string
	for {
		why = ""
		for _, name := range streams {
			if why = c.notCurrent(ctx, name); why != "" {
				break
			}
		}
		if why == "" {
			return nil
		}
		select {
		case <-ctx.Done():
			return fmt.Errorf("streams not current: %s: %w", why, ctx.Err())
		case <-time.After(100 * time.Millisecond):
		}
	}
}

func (c *NATSCluster) notCurrent(ctx context.Context, stream string) string {
	info, err := c.streamInfo(ctx, stream)
	if err != nil {
		return err.Error()
	}
	ci := info.Cluster
	if ci == nil || ci.Leader == "" {
		return stream + " has no leader"
	}
	current := 0
	for _, p := range ci.Replicas {
		if p.Current && !p.Offline {
			current++
		}
	}
	if current != len(c.Nodes)-1 {
		return fmt.Sprintf("%s: %d of %d replicas current", stream, current, len(c.Nodes)-1)
	}
	return ""
}
