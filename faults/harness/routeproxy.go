package harness

import (
	"fmt"
	"io"
	"net"
	"sync"
	"time"
)

// routeProxy forwards the route connections one cluster node solicits to
// another node's cluster port. Each ordered pair of nodes has its own, so
// cutting the proxies of one node's pairs partitions it from the others
// while it keeps running, and the others stay connected among
// themselves.
type routeProxy struct {
	ln     net.Listener
	target string

	mu    sync.Mutex
	cut   bool
	conns map[net.Conn]bool
}

func newRouteProxy(target string) (*routeProxy, error) {
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		return nil, fmt.Errorf("listen route proxy: %w", err)
	}
	p := &routeProxy{ln: ln, target: target, conns: map[net.Conn]bool{}}
	go p.serve()
	return p, nil
}

// Addr is the address the soliciting node is given as its route.
func (p *routeProxy) Addr() string { return p.ln.Addr().String() }

func (p *routeProxy) serve() {
	for {
		in, err := p.ln.Accept()
		if err != nil {
			return
		}
		go p.forward(in)
	}
}

func (p *routeProxy) forward(in net.Conn) {
	p.mu.Lock()
	cut := p.cut
	p.mu.Unlock()
	if cut {
		in.Close()
		return
	}
	p.mu.Lock()
	target := p.target
	p.mu.Unlock()
	out, err := net.DialTimeout("tcp", target, 2*time.Second)
	if err != nil {
		in.Close()
		return
	}
	p.mu.Lock()
	if p.cut {
		p.mu.Unlock()
		in.Close()
		out.Close()
		return
	}
	p.conns[in], p.conns[out] = true, true
	p.mu.Unlock()
	done := make(chan struct{}, 2)
	pipe := func(dst, src net.Conn) {
		_, _ = io.Copy(dst, src)
		done <- struct{}{}
	}
	go pipe(out, in)
	go pipe(in, out)
	<-done
	in.Close()
	out.Close()
	<-done
	p.mu.Lock()
	delete(p.conns, in)
	delete(p.conns, out)
	p.mu.Unlock()
}

// setTarget points the proxy at another address (a node started again on
// new ports); connections already through it are left alone.
func (p *routeProxy) setTarget(target string) {
	p.mu.Lock()
	p.target = target
	p.mu.Unlock()
}

// Cut closes every connection through the proxy and refuses new ones
// (accepted and closed at once, as a peer gone from the network looks to
// a reconnecting route) until Heal.
func (p *routeProxy) Cut() {
	p.mu.Lock()
	defer p.mu.Unlock()
	p.cut = true
	for c := range p.conns {
		c.Close()
	}
}

// Heal lets connections through again; the node's route reconnects on its
// own retry timer.
func (p *routeProxy) Heal() {
	p.mu.Lock()
	p.cut = false
	p.mu.Unlock()
}

func (p *routeProxy) Close() {
	p.Cut()
	p.ln.Close()
}
