// Package durable is retryd's one consumer runtime: it runs the durable
// JetStream consumers of ingress, triggers, the scheduler's policy stage,
// the jobs projection, or a service of your own that consumes RETRIES. It
// creates them, hands their messages to a handler on a bounded number of
// goroutines, settles each message by the handler's error, recreates
// consumers (and, when allowed, streams) that were deleted, and drains
// them on stop.
//
// A Spec runs in one of two modes. With Handle, each message is handed
// over on its own. With HandleBatch (batch mode, batch.go), the messages
// already delivered are handed over together, up to Spec.Batch, so that
// a handler can apply them in one transaction; the handler settles each
// message with its own methods (Ack, NakWithDelay, TermWithReason...) and
// its error settles the ones it left, by the rules below.
//
// The handler's error decides what happens to its message:
//
//   - nil: acked. A handler commits its change, with the inbox claim,
//     before it returns.
//   - wrapping contract.ErrInvalid or contract.ErrTooLarge: the message is
//     malformed; it is terminated with the reason and counted in
//     Config.Malformed.
//   - made by Reject: terminated with the reason but not counted as
//     malformed (the handler counted it, e.g. as a rejection).
//   - wrapping ErrAbandon: left alone, unacked, as if the process died
//     there; JetStream delivers it again after the ack wait. Tests use it
//     for failpoints: a failpoint.Func's error wraps it, so a handler
//     returns what failpoint.Func.At returned.
//   - made by NakAfter: handed back for a delivery after the delay it
//     names, without being counted as a failure: the handler waits for
//     something that has not happened yet.
//   - anything else is transient (the database is away): the message is
//     handed back (nak) for a delivery after Config.NakDelay and counted in
//     Config.Failed.
//
// A consumer that was deleted, or lost with its stream, is created again
// with the same configuration at the next check: every
// Config.CheckInterval, half a second after the client reports the
// consumer deleted or its heartbeats missed, and within seconds after a
// check that failed. An operator's mistake or a deleted stream does not
// leave the owner deaf until its next restart. Recreated consumers start where their configuration says
// (normally the start of the stream): owners must be idempotent, as
// retryd's are through the inbox and unique keys.
package durable

import (
	"context"
	"errors"
	"fmt"
	"time"

	"github.com/nats-io/nats.go/jetstream"
	"github.com/prometheus/client_golang/prometheus"
	"github.com/rs/zerolog"

	"github.com/retryd/retryd/internal/streams"
)

// ErrAbandon, wrapped by a handler's error, leaves the message unacked as
// if the process had died at that point.
var ErrAbandon = errors.New("message abandoned")

// ErrStopped is returned by Start after Drain.
var ErrStopped = errors.New("durable consumers stopped")

// Reject wraps err so that the message is terminated without being
// counted as malformed: the handler already counted it.
func Reject(err error) error { return &rejectError{err: err} }

type rejectError struct{ err error }

func (e *rejectError) Error() string { return e.err.Error() }
func (e *rejectError) Unwrap() error { return e.err }

// NakAfter returns an error that hands the message back to be delivered
// again after delay. It is not a failure: the handler is waiting for
// another message to be applied first.
func NakAfter(delay time.Duration) error { return &nakAfterError{delay: delay} }

type nakAfterError struct{ delay time.Duration }

func (e *nakAfterError) Error() string { return "deliver again after " + e.delay.String() }

// Handler handles one message; see the package documentation for what its
// error does. ctx ends only when Drain gives up waiting.
type Handler func(ctx context.Context, msg jetstream.Msg) error

// Spec is one durable consumer. Exactly one of Handle and HandleBatch is
// set.
type Spec struct {
	// Stream is the stream the consumer reads.
	Stream string
	// Config is the consumer's configuration; Durable is required.
	Config jetstream.ConsumerConfig
	// Handle handles every message, one at a time.
	Handle Handler
	// HandleBatch handles the messages in batches (batch mode).
	HandleBatch BatchHandler
	// Workers is how many messages (batches, in batch mode) are handled at
	// once. Default 1.
	Workers int

	// The fields below are for batch mode only.

	// Batch bounds the messages of one batch; it is also how many the
	// client pulls ahead (at most Config.MaxAckPending). Default 100.
	Batch int
	// Progress is how often the messages handed over and not settled yet
	// get an in-progress ack, once they have waited that long: a short
	// AckWait then moves a dead process's messages on quickly without
	// redelivering a slow batch of a live one. Zero sends none.
	Progress time.Duration
	// InProgress counts the in-progress acks sent. Nil counts nothing.
	InProgress prometheus.Counter
	// Expiry is how long one pull request waits for messages (at least
	// 1s); zero is DefaultExpiry.
	Expiry time.Duration
}

// DefaultExpiry is a pull request's life when a Spec does not say. The
// client's own default (30 s, heartbeats every 15 s) left a consumer idle
// for up to half a minute when the stream leader changed under it, or its
// node was cut off and came back, with its pull requests lost: it only
// asks again once the heartbeats have been missed. Fault scenario 19
// measured how long; docs/reliability.md has the figures.
const DefaultExpiry = 5 * time.Second

// batchMode reports whether s hands its messages over in batches.
func (s Spec) batchMode() bool { return s.HandleBatch != nil }

// Defaults of Config.
const (
	DefaultCheckInterval = 30 * time.Second
	// pullBatch is how many messages each worker asks for ahead.
	pullBatch = 8
	// DefaultBatch is Spec.Batch's default.
	DefaultBatch = 100
)

// Config configures a Group. JS is required.
type Config struct {
	JS     jetstream.JetStream
	Logger zerolog.Logger
	// Streams, when set, lets the group recreate a deleted stream
	// (streams.CreateMissing with these options) before the consumers on it. Nil
	// leaves streams to the operator: consumers on a missing stream are
	// recreated once it is back.
	Streams *streams.Options
	// CheckInterval is how often the consumers are looked for and
	// recreated when missing. Default 30s.
	CheckInterval time.Duration
	// Malformed counts terminated malformed messages by consumer; its one
	// label is the consumer name. Nil counts nothing.
	Malformed *prometheus.CounterVec
	// Failed counts messages handed back for a later delivery, by consumer.
	// Nil counts nothing.
	Failed *prometheus.CounterVec
	// NakDelay says how long a message whose handling failed waits before
	// it is delivered again, from how often it was delivered. Default one
	// second per delivery, at most 30s.
	NakDelay func(delivered uint64) time.Duration
}

func (c *Config) validate(specs []Spec) error {
	if c.JS == nil {
		return errors.New("Config.JS is required")
	}
	if c.CheckInterval < 0 {
		return fmt.Errorf("Config.CheckInterval must not be negative, got %s", c.CheckInterval)
	}
	if c.CheckInterval == 0 {
		c.CheckInterval = DefaultCheckInterval
	}
	if c.NakDelay == nil {
		c.NakDelay = func(delivered uint64) time.Duration {
			return min(time.Duration(delivered)*time.Second, 30*time.Second)
		}
	}
	if c.Streams != nil {
		if err := c.Streams.Validate(); err != nil {
			return fmt.Errorf("Config.Streams: %w", err)
		}
	}
	if len(specs) == 0 {
		return errors.New("no consumers to run")
	}
	seen := map[string]bool{}
	for i, s := range specs {
		key := s.Stream + "/" + s.Config.Durable
		switch {
		case s.Stream == "":
			return fmt.Errorf("Spec[%d].Stream is required", i)
		case s.Config.Durable == "":
			return fmt.Errorf("Spec[%d].Config.Durable is required", i)
		case s.Handle == nil && s.HandleBatch == nil:
			return fmt.Errorf("Spec[%d].Handle is required (or Spec[%d].HandleBatch)", i, i)
		case s.Handle != nil && s.HandleBatch != nil:
			return fmt.Errorf("Spec[%d]: Handle and HandleBatch are both set", i)
		case s.Batch < 0 || s.Batch > 10_000:
			return fmt.Errorf("Spec[%d].Batch must be between 1 and 10000, got %d", i, s.Batch)
		case s.Progress < 0:
			return fmt.Errorf("Spec[%d].Progress must not be negative, got %s", i, s.Progress)
		case s.Expiry < 0:
			return fmt.Errorf("Spec[%d].Expiry must not be negative, got %s", i, s.Expiry)
		case !s.batchMode() && (s.Batch != 0 || s.Progress != 0 || s.InProgress != nil):
			return fmt.Errorf("Spec[%d]: Batch, Progress and InProgress are for HandleBatch only", i)
		case s.Workers < 0:
			return fmt.Errorf("Spec[%d].Workers must not be negative, got %d", i, s.Workers)
		case seen[key]:
			return fmt.Errorf("Spec[%d]: consumer %s is listed twice", i, key)
		}
		seen[key] = true
	}
	return nil
}
