package contract_test

import (
	"errors"
	"testing"
	"time"

	"github.com/stretchr/testify/require"

	"github.com/retryd/retryd/pkg/contract"
)

// now is the fixed clock of every test.
var now = time.Date(2025, 3, 14, 15, 9, 26, 535000000, time.UTC)

// requireFieldErr asserts that err wraps target (contract.ErrInvalid or
// contract.ErrTooLarge), is a *contract.FieldError, and that its message
// names field.
func requireFieldErr(t *testing.T, err error, target error, field string) {
	t.Helper()
	require.Error(t, err)
	require.ErrorIs(t, err, target, err.Error())
	other := contract.ErrTooLarge
	if target == contract.ErrTooLarge {
		other = contract.ErrInvalid
	}
	require.False(t, errors.Is(err, other), "%v wraps both ErrInvalid and ErrTooLarge", err)
	var fe *contract.FieldError
	require.ErrorAs(t, err, &fe)
	require.Contains(t, err.Error(), field)
}

func errorsIs(err, target error) bool { return errors.Is(err, target) }

func asFieldError(err error, fe **contract.FieldError) bool { return errors.As(err, fe) }
