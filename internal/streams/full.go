package streams

import (
	"errors"
	"strings"

	"github.com/nats-io/nats.go/jetstream"
)

// Error codes of a publish JetStream refused for want of room (nats-server
// errors.json; nats.go has no constants for them).
const (
	// ErrCodeStoreFailed (JSStreamStoreFailedF, status 503) carries the
	// store's error: "maximum bytes exceeded", "maximum messages exceeded"
	// or "maximum messages per subject exceeded" from a stream at a limit
	// with discard new.
	ErrCodeStoreFailed jetstream.ErrorCode = 10077
	// ErrCodeInsufficientResources (JSInsufficientResourcesErr, status
	// 503): the server or the account is out of JetStream storage.
	ErrCodeInsufficientResources jetstream.ErrorCode = 10023
)

// Full reports whether err is JetStream refusing a publish because a
// stream, or the storage under it, is full. Nothing was stored; the same
// message published again (same Nats-Msg-Id) is stored once there is room.
func Full(err error) bool {
	var apiErr *jetstream.APIError
	if !errors.As(err, &apiErr) {
		return false
	}
	switch apiErr.ErrorCode {
	case ErrCodeInsufficientResources:
		return true
	case ErrCodeStoreFailed:
		return strings.Contains(apiErr.Description, "exceeded")
	}
	return false
}
