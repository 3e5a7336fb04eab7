package daemon

import (
	"context"
	"errors"
	"fmt"
	"net"
	"net/http"
	"time"

	"github.com/rs/zerolog"

	"github.com/retryd/retryd/internal/serve"
	"github.com/retryd/retryd/internal/telemetry"
)

// Listener is one address a binary serves and what it serves there: the
// handler under /v1/ and the routes the index at GET /v1/ lists. Every
// listener also answers /healthz, /readyz and /metrics.
type Listener struct {
	Addr    string
	Handler http.Handler
	Routes  []serve.Route
}

// Serve listens on every listener, behind the auth guard and tracing, and
// serves until ctx is done or a server fails. Then it stops the service
// first (stop, bounded by timeout when ctx is done: readiness off and
// consumers drained while HTTP still answers) and the servers after, and
// returns every error. ready, when set, is told the listeners' addresses,
// in order, once they listen (a port 0 resolved). If a listener cannot be
// opened, the service is stopped and nothing is served.
func (h *Host) Serve(ctx context.Context, log zerolog.Logger, listeners []Listener, stop func(context.Context) error,
	timeout time.Duration, ready func(addrs []string)) error {
	lns := make([]net.Listener, 0, len(listeners))
	for _, l := range listeners {
		ln, err := net.Listen("tcp", l.Addr)
		if err != nil {
			for _, open := range lns {
				_ = open.Close()
			}
			_ = stop(context.Background())
			return fmt.Errorf("listen on %s: %w", l.Addr, err)
		}
		lns = append(lns, ln)
	}
	httpCtx, stopHTTP := context.WithCancel(context.WithoutCancel(ctx))
	defer stopHTTP()
	httpDone := make(chan error, len(listeners))
	addrs := make([]string, len(lns))
	for i, l := range listeners {
		mux := serve.NewMux(h.Registry, h.Health)
		mux.Handle("/v1/", l.Handler)
		mux.Handle(serve.IndexPath, serve.IndexHandler(l.Routes))
		srv := serve.NewServer("", telemetry.Handler(h.guard.Handler(mux), h.service))
		srv.TLSConfig = h.tls
		go func(ln net.Listener) { httpDone <- serve.Serve(httpCtx, srv, ln, log) }(lns[i])
		addrs[i] = lns[i].Addr().String()
	}
	if ready != nil {
		ready(addrs)
	}

	select {
	case <-ctx.Done():
		log.Info().Msg("shutting down")
	case err := <-httpDone:
		_ = stop(context.Background())
		stopHTTP()
		for range len(listeners) - 1 {
			err = errors.Join(err, <-httpDone)
		}
		return err
	}
	stopCtx, cancel := context.WithTimeout(context.Background(), timeout)
	defer cancel()
	errs := []error{stop(stopCtx)}
	stopHTTP()
	for range listeners {
		errs = append(errs, <-httpDone)
	}
	return errors.Join(errs...)
}
