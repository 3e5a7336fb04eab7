package triggers

import (
	"crypto/sha256"
	"encoding/base32"
)

// crockford is the base32 alphabet of ULIDs, so delivery ids look like
// the other ids of retryd and are subject-safe.
var crockford = base32.NewEncoding("0123456789ABCDEFGHJKMNPQRSTVWXYZ").WithPadding(base32.NoPadding)

// DeliveryID is the id of the delivery of an event to a trigger: the first
// 26 base32 characters (130 bits) of SHA-256(event id, trigger id). The
// same event offered to the same trigger twice (a redelivery, a second
// instance) gets the same id, which the table's primary key stores once.
func DeliveryID(eventID, triggerID string) string {
	h := sha256.New()
	h.Write([]byte(eventID))
	h.Write([]byte{0})
	h.Write([]byte(triggerID))
	return crockford.EncodeToString(h.Sum(nil))[:26]
}

// RunID is the id of the run a delivery launches: "run-" + the delivery
// id. A delivery has at most one run: workflow_runs.delivery_id is unique
// and the run request's Nats-Msg-Id is "run-requested:<run id>".
func RunID(deliveryID string) string { return "run-" + deliveryID }
