package triggers_test

import (
	"fmt"

	"github.com/retryd/retryd/services/triggers"
)

// A delivery id is derived from the event and the trigger, so every
// instance that sees the same event computes the same delivery, and the
// run id is derived from the delivery.
func ExampleDeliveryID() {
	id := triggers.DeliveryID("01J9Z8Q4T5V6W7X8Y9Z0ABCDEF", "onboard-paid-invoices")
	fmt.Println(id, len(id))
	fmt.Println(triggers.RunID(id) == "run-"+id)
	// Output:
	// N0WJC2C60PF51MF954J38QAKEV 26
	// true
}
