package worker

import (
	"context"
	"fmt"
	"time"

	"github.com/nats-io/nats.go/jetstream"

	"github.com/retryd/retryd/pkg/contract"
)

// EnqueueSource is the CloudEvents source of jobs published by Enqueue.
const EnqueueSource = "retryd/enqueue"

// Enqueue publishes the first attempt of a job on jobs.<job_type>, or on
// jobs.<job_type>.high or .low when job.Priority says so, and returns its
// id. An empty ID gets a new ULID; Attempt must be 0 or 1.
// The Nats-Msg-Id is "job:<id>:1", so enqueueing the same id twice within
// the stream's duplicate window stores one job.
func Enqueue(ctx context.Context, js jetstream.JetStream, job contract.JobData) (string, error) {
	if job.ID == "" {
		job.ID = contract.NewID()
	}
	if job.Attempt == 0 {
		job.Attempt = 1
	}
	if job.Attempt != 1 {
		return "", fmt.Errorf("enqueue job: %w", &contract.FieldError{Field: "data.attempt", Reason: fmt.Sprintf("must be 1: Enqueue publishes first attempts only, got %d", job.Attempt), Err: contract.ErrInvalid})
	}
	msg, err := contract.NewJobMsg(EnqueueSource, job, time.Now())
	if err != nil {
		return "", fmt.Errorf("enqueue job: %w", err)
	}
	if _, err := js.PublishMsg(ctx, msg); err != nil {
		return "", fmt.Errorf("enqueue job %s: %w", job.ID, err)
	}
	return job.ID, nil
}
