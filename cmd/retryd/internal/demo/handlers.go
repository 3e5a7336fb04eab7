package demo

import (
	"context"
	"errors"
	"fmt"
	"math/rand/v2"
	"time"

	"github.com/retryd/retryd/internal/wait"
	"github.com/retryd/retryd/pkg/errclass"
	"github.com/retryd/retryd/pkg/worker"
)

// Job types the demo's flaky worker runs.
const (
	JobSendEmail  = "send_email"
	JobSyncCRM    = "sync_crm"
	JobChargeCard = "charge_card"
)

// Handlers are the demo's flaky worker: each job type fails now and then
// the way real integrations do (timeouts, rate limits, network blips, the
// odd validation error), so retries, exhaustion and analytics show up.
func Handlers() map[string]worker.Handler {
	return map[string]worker.Handler{
		JobSendEmail:  sendEmail,
		JobSyncCRM:    syncCRM,
		JobChargeCard: chargeCard,
	}
}

// work takes d unless ctx ends first (the job's timeout, or a stop).
func work(ctx context.Context, d time.Duration) error { return wait.Sleep(ctx, d) }

type emailPayload struct {
	To       string `json:"to"`
	Template string `json:"template"`
}

// sendEmail: a mail API that is slow now and then (the job's 1.2s timeout
// cuts it off), rate limits with a Retry-After, and refuses bad addresses.
func sendEmail(ctx context.Context, job *worker.Job) error {
	var p emailPayload
	if err := job.DecodePayload(&p); err != nil {
		return errclass.NonRetryable(errclass.Wrap(errclass.Validation, err))
	}
	roll := rand.Float64()
	switch {
	case roll < 0.04:
		return errclass.New(errclass.Validation, fmt.Sprintf("mail API: 422 invalid recipient address %q", p.To))
	case roll < 0.20:
		// Too slow: the job's timeout ends it and the worker reports a timeout.
		return work(ctx, 3*time.Second)
	case roll < 0.32:
		return errclass.RetryAfter(errclass.New(errclass.RateLimit, "mail API: 429 too many requests"), 2*time.Second)
	case roll < 0.40:
		return errors.New("dial tcp 10.0.4.17:587: connect: connection refused")
	}
	return work(ctx, time.Duration(80+rand.IntN(400))*time.Millisecond)
}

type crmCheckpoint struct {
	Step string   `json:"step"`
	Done []string `json:"done"`
}

// syncCRM is a three-step job that records a checkpoint after each step,
// so a retry resumes where the last attempt stopped.
func syncCRM(ctx context.Context, job *worker.Job) error {
	var cp crmCheckpoint
	if _, err := job.DecodeCheckpoint(&cp); err != nil {
		return errclass.NonRetryable(err)
	}
	steps := []string{"fetch_contact", "merge_fields", "push_update"}
	for _, step := range steps[len(cp.Done):] {
		if err := work(ctx, time.Duration(50+rand.IntN(200))*time.Millisecond); err != nil {
			return err
		}
		if rand.Float64() < 0.18 {
			return errclass.New(errclass.Temporary, fmt.Sprintf("crm: 503 service unavailable during %s", step))
		}
		cp.Done = append(cp.Done, step)
		cp.Step = step
		if err := job.SetCheckpoint(cp); err != nil {
			return err
		}
	}
	return nil
}

// chargeCard: a payment provider that rate limits hard and sometimes
// rejects the API key (not retryable: the policy gives up at once).
func chargeCard(ctx context.Context, _ *worker.Job) error {
	roll := rand.Float64()
	switch {
	case roll < 0.03:
		return errclass.New(errclass.Authentication, "payments: 401 invalid API key")
	case roll < 0.30:
		return errclass.New(errclass.RateLimit, "payments: 429 rate limit exceeded for merchant")
	case roll < 0.38:
		return errclass.New(errclass.Network, "payments: read tcp: connection reset by peer")
	}
	return work(ctx, time.Duration(100+rand.IntN(300))*time.Millisecond)
}
