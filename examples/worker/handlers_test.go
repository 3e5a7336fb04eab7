package main

import (
	"context"
	"encoding/json"
	"testing"

	"github.com/rs/zerolog"
	"github.com/stretchr/testify/require"

	"github.com/retryd/retryd/pkg/errclass"
	"github.com/retryd/retryd/pkg/worker"
)

func TestOnboardingResumesAfterTheFailedStep(t *testing.T) {
	t.Parallel()
	fx := newEffects(zerolog.Nop())
	payload := mustJSON(OnboardingPayload{User: "ada", FailAt: "send_welcome"})

	first := &worker.Job{ID: "j1", Type: TypeOnboarding, Attempt: 1, Payload: payload}
	err := fx.onboarding(context.Background(), first)
	e, ok := errclass.As(err)
	require.True(t, ok)
	require.Equal(t, errclass.Network, e.Class)
	require.JSONEq(t, `{"step":"create_account","done":["create_account"]}`, string(first.Checkpoint))

	// The retry gets the failed attempt's checkpoint back.
	retry := &worker.Job{ID: "j1", Type: TypeOnboarding, Attempt: 2, Payload: payload, Checkpoint: first.Checkpoint}
	require.NoError(t, fx.onboarding(context.Background(), retry))
	require.JSONEq(t, `{"step":"schedule_followup","done":["create_account","send_welcome","schedule_followup"]}`, string(retry.Checkpoint))
	require.Equal(t, map[string]bool{"j1:create_account": true, "j1:send_welcome": true, "j1:schedule_followup": true}, fx.done)

	bad := &worker.Job{ID: "j2", Type: TypeOnboarding, Attempt: 1, Payload: json.RawMessage(`{}`)}
	require.ErrorIs(t, fx.onboarding(context.Background(), bad), errclass.ErrValidation)
}

func TestFlakyFailsThenWorks(t *testing.T) {
	t.Parallel()
	fx := newEffects(zerolog.Nop())
	payload := mustJSON(FlakyPayload{Failures: 1, Class: "rate_limit"})
	err := fx.flaky(context.Background(), &worker.Job{ID: "f1", Attempt: 1, Payload: payload})
	e, ok := errclass.As(err)
	require.True(t, ok)
	require.Positive(t, e.RetryAfter)
	require.NoError(t, fx.flaky(context.Background(), &worker.Job{ID: "f1", Attempt: 2, Payload: payload}))
	require.True(t, fx.done["f1:2"])

	err = fx.flaky(context.Background(), &worker.Job{ID: "f2", Attempt: 1, Payload: mustJSON(FlakyPayload{Failures: 1, Class: "validation"})})
	require.ErrorIs(t, err, errclass.ErrValidation)
}
