// Package outbox is the transactional outbox every retryd service uses to
// publish to JetStream.
//
// A service writes the messages a state change must publish with Insert, in
// the same transaction as the change. After the commit its Relay publishes
// them in id order with their Nats-Msg-Id and deletes them once JetStream
// has acknowledged them. A crash between commit and publish, or between
// publish and delete, leaves the rows in place and the relay publishes them
// again; JetStream drops the repeat because the Nats-Msg-Id is the same.
// So every message is stored at least once and, inside the stream's
// duplicate window, exactly once.
package outbox

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"strings"

	"github.com/jackc/pgx/v5"
	"github.com/nats-io/nats.go"

	"github.com/retryd/retryd/pkg/contract"
	"github.com/retryd/retryd/pkg/tracing"
)

// ErrMissingMsgID is returned by Insert for a message without a
// Nats-Msg-Id header: without it a republished message would be stored
// twice.
var ErrMissingMsgID = errors.New("message has no " + contract.HeaderMsgID + " header")

// ErrInvalidMsg is returned by Insert for a message the relay could never
// publish (no subject, a wildcard subject, a reply subject).
var ErrInvalidMsg = errors.New("message cannot be published")

const insertSQL = `
INSERT INTO outbox (owner, subject, msg_id, headers, payload)
SELECT $1, m.subject, m.msg_id, m.headers, m.payload
FROM unnest($2::text[], $3::text[], $4::jsonb[], $5::bytea[]) WITH ORDINALITY AS m(subject, msg_id, headers, payload, ord)
ORDER BY m.ord`

// Insert adds msgs to owner's outbox inside tx, in order: subject, every
// header (Nats-Msg-Id is required) and body. They are published after tx
// commits, by the Relay of the same owner. Nothing is inserted when any
// message is invalid. When tracing is on, the trace context of ctx is
// stored with the headers (traceparent, tracestate) so the published
// message continues the trace of the work that wrote it; msgs are not
// modified.
func Insert(ctx context.Context, tx pgx.Tx, owner string, msgs ...*nats.Msg) error {
	if owner == "" {
		return errors.New("insert outbox messages: owner is required")
	}
	if len(msgs) == 0 {
		return nil
	}
	subjects := make([]string, len(msgs))
	ids := make([]string, len(msgs))
	headers := make([]string, len(msgs))
	payloads := make([][]byte, len(msgs))
	for i, m := range msgs {
		if err := validate(m); err != nil {
			return fmt.Errorf("insert outbox message %d: %w", i, err)
		}
		h, err := json.Marshal(withTrace(ctx, m.Header))
		if err != nil {
			return fmt.Errorf("encode headers of %s: %w", m.Header.Get(contract.HeaderMsgID), err)
		}
		subjects[i] = m.Subject
		ids[i] = m.Header.Get(contract.HeaderMsgID)
		headers[i] = string(h)
		payloads[i] = m.Data
		if payloads[i] == nil {
			payloads[i] = []byte{}
		}
	}
	if _, err := tx.Exec(ctx, insertSQL, owner, subjects, ids, headers, payloads); err != nil {
		return fmt.Errorf("insert outbox messages: %w", err)
	}
	return nil
}

// withTrace returns h plus the trace context of ctx, leaving h untouched;
// without tracing (or a span in ctx) it returns h itself.
func withTrace(ctx context.Context, h nats.Header) nats.Header {
	traced := nats.Header{}
	tracing.Inject(ctx, traced)
	if len(traced) == 0 {
		return h
	}
	for k, v := range h {
		if _, ok := traced[k]; !ok {
			traced[k] = v
		}
	}
	return traced
}

func validate(m *nats.Msg) error {
	if m == nil {
		return fmt.Errorf("%w: nil message", ErrInvalidMsg)
	}
	if m.Subject == "" || strings.ContainsAny(m.Subject, " \t\r\n") {
		return fmt.Errorf("%w: subject %q", ErrInvalidMsg, m.Subject)
	}
	for tok := range strings.SplitSeq(m.Subject, ".") {
		if tok == "" || tok == "*" || tok == ">" {
			return fmt.Errorf("%w: subject %q", ErrInvalidMsg, m.Subject)
		}
	}
	if m.Reply != "" {
		return fmt.Errorf("%w: reply subject set on %q", ErrInvalidMsg, m.Subject)
	}
	if m.Header.Get(contract.HeaderMsgID) == "" {
		return fmt.Errorf("%w (subject %q)", ErrMissingMsgID, m.Subject)
	}
	return nil
}
