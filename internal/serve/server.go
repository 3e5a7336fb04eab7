package serve

import (
	"net/http"
	"time"
)

// Limits of the servers NewServer builds. Requests and responses are small
// JSON documents (bodies are capped far below what these allow), so a
// client slower than this is stuck or hostile.
const (
	ReadHeaderTimeout = 10 * time.Second
	ReadTimeout       = 30 * time.Second
	WriteTimeout      = time.Minute
	IdleTimeout       = 2 * time.Minute
	MaxHeaderBytes    = 64 << 10
)

// NewServer returns the HTTP server of a retryd binary: h behind Go's
// cross-origin protection, with the timeouts and header limit above. A
// browser's unsafe request (POST, PUT, PATCH, DELETE) sent by a page of
// another origin is refused with 403, so a page on another site cannot
// pause a source or create a trigger through the browser of someone who
// can reach the API. Requests that carry no browser headers (curl, the
// CLI, services) pass.
func NewServer(addr string, h http.Handler) *http.Server {
	cop := http.NewCrossOriginProtection()
	cop.SetDenyHandler(http.HandlerFunc(func(w http.ResponseWriter, _ *http.Request) {
		WriteJSON(w, http.StatusForbidden, ErrorBody{Error: ErrorDetail{
			Code:    CodeCrossOrigin,
			Message: "cross-origin request refused: a page of another origin may not change anything here",
		}})
	}))
	return &http.Server{
		Addr:              addr,
		Handler:           cop.Handler(h),
		ReadHeaderTimeout: ReadHeaderTimeout,
		ReadTimeout:       ReadTimeout,
		WriteTimeout:      WriteTimeout,
		IdleTimeout:       IdleTimeout,
		MaxHeaderBytes:    MaxHeaderBytes,
	}
}
