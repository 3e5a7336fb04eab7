package contract

import (
	"fmt"
	"strconv"

	"github.com/nats-io/nats.go"
)

// CheckLifecycleHeaders checks the headers of lifecycle message lc (as
// DecodeLifecycle returned it) against its subject and body: Nats-Msg-Id
// is required and is the envelope's id (it is how JetStream drops a
// duplicate publish, and a consumer must dedupe on the id the body
// names), and each Retryd-* header present agrees with the subject and
// the data. The Retryd-* headers stay optional: a publisher that leaves
// them out loses only readability in `nats stream view`. Errors wrap
// ErrInvalid and name the header, never its value.
func CheckLifecycleHeaders(h nats.Header, lc LifecycleEvent) error {
	id := h.Get(HeaderMsgID)
	switch {
	case id == "":
		return fieldErr("header "+HeaderMsgID, "is required on every lifecycle event")
	case id != lc.Envelope.ID:
		return fieldErr("header "+HeaderMsgID, "does not match the envelope id")
	}
	want := map[string]string{
		HeaderKind:    lc.Kind,
		HeaderItemID:  lc.ID,
		HeaderAttempt: strconv.Itoa(lc.Attempt()),
		HeaderEvent:   string(lc.Event),
	}
	for _, name := range []string{HeaderKind, HeaderItemID, HeaderAttempt, HeaderEvent} {
		got := h.Values(name)
		switch {
		case len(got) == 0:
		case len(got) > 1:
			return fieldErr("header "+name, fmt.Sprintf("is set %d times", len(got)))
		case got[0] != want[name]:
			return fieldErr("header "+name, "does not match the subject and data")
		}
	}
	return nil
}
