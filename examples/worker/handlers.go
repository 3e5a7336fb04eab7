package main

import (
	"context"
	"errors"
	"fmt"
	"slices"
	"sync"
	"time"

	"github.com/rs/zerolog"

	"github.com/retryd/retryd/pkg/errclass"
	"github.com/retryd/retryd/pkg/worker"
)

// Job types of the example.
const (
	TypeOnboarding = "onboarding"
	TypeFlaky      = "flaky_api"
)

// onboardingSteps run in order; the checkpoint names the last one done.
var onboardingSteps = []string{"create_account", "send_welcome", "schedule_followup"}

// OnboardingPayload is the input of an onboarding job. FailAt names a
// step that fails (with a network error) on the job's first attempt, to
// show the resume.
type OnboardingPayload struct {
	User   string `json:"user"`
	FailAt string `json:"fail_at,omitempty"`
}

// OnboardingCheckpoint is the progress an onboarding job records after
// each step; retryd shows Step as the job's current_step.
type OnboardingCheckpoint struct {
	Step string   `json:"step"`
	Done []string `json:"done"`
}

// effects stands in for the external systems the steps change. A real
// handler would write with a unique key (here "<job id>:<step>") so that a
// step run twice (a worker killed before it could checkpoint) has its
// effect once.
type effects struct {
	mu   sync.Mutex
	done map[string]bool
	log  zerolog.Logger
}

func newEffects(log zerolog.Logger) *effects {
	return &effects{done: map[string]bool{}, log: log}
}

// apply performs the effect once per key and reports whether it was new.
func (e *effects) apply(key string) bool {
	e.mu.Lock()
	defer e.mu.Unlock()
	if e.done[key] {
		e.log.Info().Str("key", key).Msg("effect already applied; skipping")
		return false
	}
	e.done[key] = true
	e.log.Info().Str("key", key).Msg("effect applied")
	return true
}

// onboarding is a three-step job that checkpoints after each step and, on
// a retry, starts after the last step its checkpoint names.
func (e *effects) onboarding(ctx context.Context, job *worker.Job) error {
	var in OnboardingPayload
	if err := job.DecodePayload(&in); err != nil {
		return errclass.Wrap(errclass.Validation, err)
	}
	if in.User == "" {
		return errclass.New(errclass.Validation, "payload.user is required")
	}
	var cp OnboardingCheckpoint
	if _, err := job.DecodeCheckpoint(&cp); err != nil {
		return errclass.Wrap(errclass.Validation, err)
	}
	start := 0
	if i := slices.Index(onboardingSteps, cp.Step); i >= 0 {
		start = i + 1
	}
	for _, step := range onboardingSteps[start:] {
		if err := ctx.Err(); err != nil {
			return err
		}
		if step == in.FailAt && job.Attempt == 1 {
			return errclass.New(errclass.Network, fmt.Sprintf("%s: connection reset by peer", step))
		}
		e.apply(job.ID + ":" + step)
		cp.Step, cp.Done = step, append(cp.Done, step)
		if err := job.SetCheckpoint(cp); err != nil {
			return err
		}
	}
	return nil
}

// FlakyPayload makes a flaky_api job fail Failures times with Class
// before it works.
type FlakyPayload struct {
	Failures int    `json:"failures"`
	Class    string `json:"class"`
}

// flaky calls an unreliable API: it fails while the attempt is within
// Failures, then records its effect keyed by the idempotency key.
func (e *effects) flaky(ctx context.Context, job *worker.Job) error {
	var in FlakyPayload
	if err := job.DecodePayload(&in); err != nil {
		return errclass.Wrap(errclass.Validation, err)
	}
	if job.Attempt <= in.Failures {
		switch in.Class {
		case "timeout":
			// Overrun the job's timeout: the SDK reports class timeout.
			<-ctx.Done()
			return ctx.Err()
		case "rate_limit":
			return errclass.RetryAfter(errors.New("HTTP 429: too many requests"), 2*time.Second)
		case "validation":
			return errclass.New(errclass.Validation, "invalid request: field 'email' is malformed")
		default:
			return errors.New("upstream temporarily unavailable (HTTP 503)")
		}
	}
	e.apply(job.IdempotencyKey())
	return nil
}
