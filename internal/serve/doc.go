// Package serve holds what every retryd HTTP server shares: the health and
// metrics endpoints, JSON responses, the error body, strict JSON decoding
// and a graceful run loop.
//
// Errors are written as
//
//	{"error": {"code": "invalid_input", "message": "...", "field": "..."}}
//
// with 400 (contract.ErrInvalid), 413 (contract.ErrTooLarge), 404
// (pgdb.ErrNotFound), 409 (pgdb.ErrConflict), 415
// (ErrUnsupportedMediaType) and 500 for anything else, whose message is
// not shown to the client.
//
// # Stopping
//
// A service stops in this order, so that no request or message is cut off
// half way and load balancers stop sending traffic first:
//
//  1. Health.SetReady(false): /readyz answers 503 and traffic drains away.
//  2. Stop the NATS consumers (drain): in-flight messages finish and are
//     acked.
//  3. Shut the HTTP server down (Run returns when its context is done, after
//     in-flight requests finished or ShutdownTimeout passed).
//  4. Close the Postgres pools and the NATS connection.
package serve
