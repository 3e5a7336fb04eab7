// Package contracttest holds checks for tests of code that decodes or
// builds retryd's messages: what a refusal must look like, and lifecycle
// messages of any type. The decoder fuzz tests of pkg/contract and
// faults/decoders share it, and a custom owner's tests may use it too. No
// program needs it at run time: TestSDKDependenciesStayLight keeps it out
// of the SDK's packages.
package contracttest

import (
	"errors"
	"testing"

	"github.com/retryd/retryd/pkg/contract"
)

// CheckRefusal fails t unless err is a *contract.FieldError with a reason
// that wraps exactly one of contract.ErrInvalid and contract.ErrTooLarge:
// what HTTP 400 and 413 and a NATS Term are mapped from.
func CheckRefusal(t testing.TB, err error) {
	t.Helper()
	var fe *contract.FieldError
	if !errors.As(err, &fe) {
		t.Fatalf("error %q (%T) is not a *contract.FieldError", err, err)
	}
	if errors.Is(err, contract.ErrInvalid) == errors.Is(err, contract.ErrTooLarge) {
		t.Fatalf("error %q must wrap exactly one of ErrInvalid and ErrTooLarge", err)
	}
	if fe.Reason == "" {
		t.Fatalf("error %q has no reason", err)
	}
}
