package contracttest

import (
	"testing"
	"time"

	"github.com/nats-io/nats.go"

	"github.com/retryd/retryd/pkg/contract"
)

// LifecycleMsg builds the message for ev carrying data, one of the
// lifecycle data types by value, and fails t if it cannot. Tests that
// publish several kinds of lifecycle event through one helper call it:
// contract.NewLifecycleMsg takes the SDK's unexported item interface,
// which a test outside pkg/contract can only reach by naming each type.
func LifecycleMsg(t testing.TB, source string, ev contract.Lifecycle, data any, at time.Time) *nats.Msg {
	t.Helper()
	var msg *nats.Msg
	var err error
	switch d := data.(type) {
	case contract.FailedData:
		msg, err = contract.NewLifecycleMsg(source, ev, d, at)
	case contract.SucceededData:
		msg, err = contract.NewLifecycleMsg(source, ev, d, at)
	case contract.ScheduledData:
		msg, err = contract.NewLifecycleMsg(source, ev, d, at)
	case contract.DueData:
		msg, err = contract.NewLifecycleMsg(source, ev, d, at)
	case contract.ExhaustedData:
		msg, err = contract.NewLifecycleMsg(source, ev, d, at)
	case contract.CancelledData:
		msg, err = contract.NewLifecycleMsg(source, ev, d, at)
	case contract.HeldData:
		msg, err = contract.NewLifecycleMsg(source, ev, d, at)
	case contract.ReleasedData:
		msg, err = contract.NewLifecycleMsg(source, ev, d, at)
	default:
		t.Fatalf("build %s message: %T is not a lifecycle data type", ev, data)
	}
	if err != nil {
		t.Fatalf("build %s message: %v", ev, err)
	}
	return msg
}
