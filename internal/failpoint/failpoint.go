// Package failpoint lets a test stop a service at a named place as if the
// process had died there: after a commit and before the publish, after the
// publish and before the ack. Every service, the outbox relay and the jobs
// projector take the same Func, so a crash test reads the same everywhere
// and a new place is one name and one call.
package failpoint

import (
	"context"

	"github.com/retryd/retryd/internal/durable"
)

// Func is consulted at each named point. It returns nil to let the point
// pass, or an error to make the caller behave as if the process died
// right there. Production code leaves it nil.
type Func func(ctx context.Context, point string) error

// At consults f at point. It returns nil when f is nil or lets the point
// pass, and an *Error otherwise.
func (f Func) At(ctx context.Context, point string) error {
	if f == nil {
		return nil
	}
	if err := f(ctx, point); err != nil {
		return &Error{Point: point, Err: err}
	}
	return nil
}

// Error is a failpoint that fired. It matches durable.ErrAbandon, so a
// consumer that gets it leaves its message unacknowledged and unanswered,
// as a dead process would: JetStream redelivers it after the ack wait.
type Error struct {
	Point string
	Err   error
}

func (e *Error) Error() string { return "failpoint " + e.Point + ": " + e.Err.Error() }

// Unwrap lets errors.Is match both the test's error and durable.ErrAbandon.
func (e *Error) Unwrap() []error { return []error{e.Err, durable.ErrAbandon} }
