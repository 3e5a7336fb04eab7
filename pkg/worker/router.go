package worker

import (
	"context"
	"fmt"
	"log/slog"

	"github.com/nats-io/nats.go/jetstream"

	"github.com/retryd/retryd/pkg/contract"
	"github.com/retryd/retryd/pkg/tracing"
)

// routerBatch is how many due events the router pulls at once.
const routerBatch = 64

// consumeDues runs the due router: every retry.job.due.<id> becomes a job
// message on jobs.<job_type> (jobs.<job_type>.<band> for a high or low
// priority job) carrying the attempt, payload, checkpoint and priority,
// with the due's Nats-Msg-Id, so a due routed twice is stored once. Any
// worker process can route any job type.
func (w *Worker) consumeDues(p *pull) {
	defer w.loops.Done()
	// Routing is a publish and an ack. Each due is routed on its own
	// goroutine, up to routerBatch at once: the publishes overlap instead of
	// waiting for each other's PubAck (one fsync each under
	// sync_interval: always), and a due whose publish is retried or hangs
	// holds one slot, not the router.
	slots := make(chan struct{}, routerBatch)
	w.fetchLoop(p, slots, w.inSlot(slots, func(msg jetstream.Msg) { w.route(p, msg) }))
}

func (w *Worker) route(p *pull, msg jetstream.Msg) {
	tctx, span := tracing.StartConsume(context.Background(), msg.Subject(), DueRouterDurable, msg.Headers())
	defer span.End()
	data, err := dueToJob(msg)
	if err != nil {
		w.terminate(DueRouterDurable, msg, err)
		return
	}
	log := w.jobLog(data)
	if w.alreadyDone(p, msg, data.ID, data.Attempt, log) {
		_ = msg.Ack()
		return
	}
	jobMsg, err := contract.NewJobMsg(w.cfg.Source, data, w.cfg.Now())
	if err != nil {
		w.terminate(DueRouterDurable, msg, err)
		return
	}
	tracing.Inject(tctx, jobMsg.Header) // the job continues the due's trace
	if _, err := w.publish(jobMsg, "job"); err != nil {
		log.Warn("route due: publish job failed; due redelivered", slog.Any("error", err))
		_ = msg.NakWithDelay(fetchBackoff)
		return
	}
	if err := msg.Ack(); err != nil {
		// A redelivered due is routed again with the same Nats-Msg-Id.
		log.Debug("ack of routed due failed", slog.Any("error", err))
	}
	w.m.routed.Inc()
	log.Debug("due routed to jobs")
}

// dueToJob decodes a due event and builds the job it asks for.
func dueToJob(msg jetstream.Msg) (contract.JobData, error) {
	ev, err := contract.DecodeLifecycle(msg.Subject(), msg.Data())
	if err != nil {
		return contract.JobData{}, err
	}
	if ev.Due == nil || ev.Kind != contract.KindJob {
		return contract.JobData{}, fmt.Errorf("%w: %s is not a job due event", contract.ErrInvalid, msg.Subject())
	}
	d := ev.Due
	if d.JobType == "" {
		return contract.JobData{}, &contract.FieldError{Field: "data.job_type", Reason: "is required to route a job due event", Err: contract.ErrInvalid}
	}
	if id := msg.Headers().Get(contract.HeaderMsgID); id != "" && id != contract.JobMsgID(d.ID, d.Attempt) {
		return contract.JobData{}, &contract.FieldError{Field: contract.HeaderMsgID, Reason: fmt.Sprintf("%q does not match the due's id and attempt", id), Err: contract.ErrInvalid}
	}
	data := contract.JobData{
		ID:           d.ID,
		JobType:      d.JobType,
		Attempt:      d.Attempt,
		Payload:      d.Payload,
		Checkpoint:   d.Checkpoint,
		Metadata:     d.Metadata,
		MaxRetries:   d.MaxRetries,
		RetryEnabled: d.RetryEnabled,
		TimeoutMS:    d.TimeoutMS,
		Priority:     d.Priority,
	}
	restoreOverrides(&data)
	if err := data.Validate(); err != nil {
		return contract.JobData{}, err
	}
	return data, nil
}
