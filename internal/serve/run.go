package serve

import (
	"context"
	"errors"
	"fmt"
	"net"
	"net/http"
	"os"
	"os/signal"
	"syscall"
	"time"

	"github.com/rs/zerolog"
)

// ShutdownTimeout bounds how long Run waits for in-flight requests once its
// context is done; connections still open then are closed.
const ShutdownTimeout = 15 * time.Second

// Run listens on srv.Addr and serves until ctx is done, then shuts the
// server down gracefully. It returns nil after a clean stop and an error if
// the server could not listen or failed. Call Health.SetReady(false) and
// stop consumers before cancelling ctx (see the package documentation).
func Run(ctx context.Context, srv *http.Server, log zerolog.Logger) error {
	addr := srv.Addr
	if addr == "" {
		addr = ":http"
	}
	ln, err := net.Listen("tcp", addr)
	if err != nil {
		return fmt.Errorf("listen on %s: %w", addr, err)
	}
	return Serve(ctx, srv, ln, log)
}

// Serve is Run on a listener the caller opened (e.g. on port 0, to learn
// the address first). It closes ln. With srv.TLSConfig set (see
// TLSConfig.Server) it serves HTTPS only: a plain HTTP request gets 400.
func Serve(ctx context.Context, srv *http.Server, ln net.Listener, log zerolog.Logger) error {
	tlsOn := srv.TLSConfig != nil
	log.Info().Str("addr", ln.Addr().String()).Bool("tls", tlsOn).Msg("http server listening")
	errc := make(chan error, 1)
	go func() {
		if tlsOn {
			// The certificates are in srv.TLSConfig.
			errc <- srv.ServeTLS(ln, "", "")
			return
		}
		errc <- srv.Serve(ln)
	}()

	select {
	case err := <-errc:
		if errors.Is(err, http.ErrServerClosed) {
			return nil
		}
		return fmt.Errorf("serve http: %w", err)
	case <-ctx.Done():
	}

	log.Info().Str("addr", ln.Addr().String()).Msg("http server shutting down")
	sctx, cancel := context.WithTimeout(context.WithoutCancel(ctx), ShutdownTimeout)
	defer cancel()
	err := srv.Shutdown(sctx)
	if err != nil {
		// In-flight requests outlived the timeout: cut them off.
		_ = srv.Close()
		err = fmt.Errorf("shut down http server: %w", err)
	}
	if serveErr := <-errc; serveErr != nil && !errors.Is(serveErr, http.ErrServerClosed) && err == nil {
		err = fmt.Errorf("serve http: %w", serveErr)
	}
	log.Info().Str("addr", ln.Addr().String()).Msg("http server stopped")
	return err
}

// SignalContext returns a context cancelled on SIGTERM or SIGINT; a second
// signal after cancellation kills the process as usual once cancel has been
// called.
func SignalContext() (context.Context, context.CancelFunc) {
	return signal.NotifyContext(context.Background(), syscall.SIGTERM, os.Interrupt)
}
