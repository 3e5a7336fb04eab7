// Package contracttest holds the check that the decoder fuzz tests of
// pkg/contract and faults/decoders share. It lives under internal so that
// it is no part of the SDK's API.
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
