package contract

import (
	"fmt"
	"strconv"
	"strings"
)

// Header names. Nats-Msg-Id makes JetStream drop a duplicate publish inside
// the stream's duplicate window; the Retryd-* headers let an operator read a
// message in `nats stream view` without decoding its body.
const (
	HeaderMsgID       = "Nats-Msg-Id"
	HeaderContentType = "Content-Type"
	HeaderKind        = "Retryd-Kind"
	HeaderItemID      = "Retryd-Item-Id"
	HeaderAttempt     = "Retryd-Attempt"
	HeaderEvent       = "Retryd-Event"
	ContentTypeJSON   = "application/json"
)

// DueMsgID is the Nats-Msg-Id of a due event: "<kind>-retry:<id>:<attempt>",
// e.g. "event-retry:01J…:3" or "event-trigger-retry:01J…:2".
func DueMsgID(kind, id string, attempt int) string {
	return kind + "-retry:" + id + ":" + strconv.Itoa(attempt)
}

// LifecycleMsgID is the Nats-Msg-Id of any lifecycle event. Due events use
// DueMsgID, the id owners dedupe an attempt on; the others are "<kind>-<event>:<id>:<attempt>",
// so the same fact published twice is stored once.
func LifecycleMsgID(kind string, ev Lifecycle, id string, attempt int) string {
	if ev == Due {
		return DueMsgID(kind, id, attempt)
	}
	return kind + "-" + string(ev) + ":" + id + ":" + strconv.Itoa(attempt)
}

// ParseDueMsgID splits "<kind>-retry:<id>:<attempt>".
func ParseDueMsgID(msgID string) (kind, id string, attempt int, err error) {
	parts := strings.Split(msgID, ":")
	if len(parts) != 3 || !strings.HasSuffix(parts[0], "-retry") {
		return "", "", 0, fieldErr("Nats-Msg-Id", fmt.Sprintf("%q is not of the form <kind>-retry:<id>:<attempt>", msgID))
	}
	kind = strings.TrimSuffix(parts[0], "-retry")
	if err := ValidateKind("Nats-Msg-Id kind", kind); err != nil {
		return "", "", 0, err
	}
	if err := ValidateID("Nats-Msg-Id id", parts[1]); err != nil {
		return "", "", 0, err
	}
	attempt, convErr := strconv.Atoi(parts[2])
	// Only the canonical form DueMsgID writes: "+3" or "03" would name the
	// same attempt with a different id, which JetStream would not dedupe.
	if convErr != nil || strconv.Itoa(attempt) != parts[2] {
		return "", "", 0, fieldErr("Nats-Msg-Id attempt", fmt.Sprintf("%q is not a number", parts[2]))
	}
	if err := ValidateAttempt("Nats-Msg-Id attempt", attempt); err != nil {
		return "", "", 0, err
	}
	return kind, parts[1], attempt, nil
}
