package errclass_test

import (
	"errors"
	"fmt"
	"io"
	"testing"
	"time"

	"github.com/stretchr/testify/require"

	"github.com/retryd/retryd/pkg/errclass"
)

func TestErrorMessage(t *testing.T) {
	t.Parallel()
	require.Equal(t, "card declined", errclass.New(errclass.Validation, "card declined").Error())
	require.Equal(t, "unexpected EOF", errclass.Wrap(errclass.Network, io.ErrUnexpectedEOF).Error())
	require.Equal(t, "timeout", errclass.ErrTimeout.Error())
	e := &errclass.Error{Message: "charge card", Cause: io.EOF}
	require.Equal(t, "charge card: EOF", e.Error())
}

func TestConstructorsKeepInnerFields(t *testing.T) {
	t.Parallel()
	base := errclass.New(errclass.RateLimit, "slow down")
	hinted := errclass.RetryAfter(fmt.Errorf("call api: %w", base), 30*time.Second)
	final := errclass.NonRetryable(fmt.Errorf("sync: %w", hinted))

	e, ok := errclass.As(fmt.Errorf("job: %w", final))
	require.True(t, ok)
	require.Equal(t, errclass.RateLimit, e.Class)
	require.Equal(t, 30*time.Second, e.RetryAfter)
	require.True(t, e.NonRetryable)
	require.Equal(t, "sync: call api: slow down", e.Error())

	rewrapped, ok := errclass.As(errclass.Wrap(errclass.Temporary, final))
	require.True(t, ok)
	require.Equal(t, errclass.Temporary, rewrapped.Class, "Wrap sets the class")
	require.Equal(t, 30*time.Second, rewrapped.RetryAfter)
	require.True(t, rewrapped.NonRetryable)

	plain, ok := errclass.As(errclass.NonRetryable(errors.New("boom")))
	require.True(t, ok)
	require.Equal(t, errclass.Class(""), plain.Class, "no class: left to the classifier")

	neg, ok := errclass.As(errclass.RetryAfter(errors.New("x"), -time.Second))
	require.True(t, ok)
	require.Zero(t, neg.RetryAfter)
}

func TestNilErrors(t *testing.T) {
	t.Parallel()
	require.NoError(t, errclass.Wrap(errclass.Timeout, nil))
	require.NoError(t, errclass.NonRetryable(nil))
	require.NoError(t, errclass.RetryAfter(nil, time.Second))
	_, ok := errclass.As(nil)
	require.False(t, ok)
	_, ok = errclass.As(errors.New("plain"))
	require.False(t, ok)
}

func TestErrorsIsAndAs(t *testing.T) {
	t.Parallel()
	cause := errors.New("socket closed")
	err := fmt.Errorf("deliver: %w", errclass.NonRetryable(errclass.Wrap(errclass.Network, cause)))

	require.ErrorIs(t, err, errclass.ErrNetwork)
	require.ErrorIs(t, err, errclass.ErrNonRetryable)
	require.ErrorIs(t, err, cause, "the cause stays reachable")
	require.NotErrorIs(t, err, errclass.ErrTimeout)

	var target *errclass.Error
	require.ErrorAs(t, err, &target)
	require.Equal(t, errclass.Network, target.Class)

	retryable := errclass.New(errclass.Validation, "bad input")
	require.ErrorIs(t, retryable, errclass.ErrValidation)
	require.NotErrorIs(t, retryable, errclass.ErrNonRetryable, "ErrNonRetryable matches the flag, not the class")
	require.NotErrorIs(t, errclass.ErrTimeout, errclass.ErrNetwork)
	require.NotErrorIs(t, errclass.New(errclass.Timeout, "x"), &errclass.Error{Class: errclass.Timeout},
		"only the package's sentinels match by class")

	sentinels := map[error]errclass.Class{
		errclass.ErrTimeout: errclass.Timeout, errclass.ErrNetwork: errclass.Network,
		errclass.ErrRateLimit: errclass.RateLimit, errclass.ErrTemporary: errclass.Temporary,
		errclass.ErrAuthentication: errclass.Authentication, errclass.ErrPermission: errclass.Permission,
		errclass.ErrValidation: errclass.Validation,
	}
	for sentinel, class := range sentinels {
		wrapped := fmt.Errorf("op: %w", sentinel)
		require.ErrorIs(t, errclass.New(class, "m"), sentinel)
		got, _ := errclass.DefaultClassifier().Classify(wrapped)
		require.Equal(t, class, got, "wrapping a sentinel classifies it")
	}
}
