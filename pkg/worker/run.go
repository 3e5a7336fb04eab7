package worker

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"runtime/debug"
	"time"

	"github.com/nats-io/nats.go/jetstream"
	"go.opentelemetry.io/otel/attribute"
	"go.opentelemetry.io/otel/trace"

	"github.com/retryd/retryd/pkg/contract"
	"github.com/retryd/retryd/pkg/tracing"
)

// fetchBackoff is the pause after a failed pull (broker unreachable,
// consumer deleted) before pulling again.
const fetchBackoff = time.Second

// consumeJobs pulls jobs of one type, never more than Concurrency at a
// time: it only asks the broker for as many messages as it has free slots,
// so nothing waits in a local buffer while its ack wait runs out. The
// type's priority bands share the slots, highest band first (see
// consumeBands).
//
// A slow handler keeps its slot (and its message, with in-progress acks)
// and nothing else: the loop pulls for the free slots while it runs, and
// each job type has its own consumers and slots, so slow or poison jobs of
// one type never hold up another type.
func (w *Worker) consumeJobs(jobType string, h Handler, pulls []*pull) {
	slots := make(chan struct{}, w.cfg.Concurrency)
	bands := make([]*band, len(pulls))
	for i, p := range pulls {
		bands[i] = &band{priority: contract.Priorities[i], p: p,
			dispatch: w.inSlot(slots, func(msg jetstream.Msg) { w.process(p, jobType, h, msg) })}
	}
	w.consumeBands(bands, slots)
}

// inSlot returns a dispatch func for fetchLoop that runs handle on its own
// goroutine and frees the message's slot when it returns.
func (w *Worker) inSlot(slots chan struct{}, handle func(jetstream.Msg)) func(jetstream.Msg) {
	return func(msg jetstream.Msg) {
		w.inflight.Add(1)
		go func() {
			defer w.inflight.Done()
			defer func() { <-slots }()
			handle(msg)
		}()
	}
}

// fetchLoop pulls up to the number of free slots in slots and hands every
// message to dispatch, which must release one slot per message when done.
func (w *Worker) fetchLoop(p *pull, slots chan struct{}, dispatch func(jetstream.Msg)) {
	for {
		free := w.claimSlots(slots)
		if free == 0 {
			return
		}
		fctx, cancel := context.WithTimeout(w.loopCtx, w.cfg.FetchWait)
		batch, err := p.consumer().Fetch(free, jetstream.FetchContext(fctx))
		got := 0
		if err == nil {
			got, err = w.dispatchBatch(batch, slots, dispatch)
		}
		cancel()
		for range free - got {
			<-slots
		}
		if w.pullFailed(p, err) {
			select {
			case <-time.After(fetchBackoff):
			case <-w.loopCtx.Done():
				return
			}
		}
	}
}

// claimSlots waits for one free slot, then takes every other slot free
// at that moment, and returns how many it holds (0 when the worker
// stops): a loop asks the broker for no more jobs than it can start, so
// none waits in a local buffer while its ack wait runs out.
func (w *Worker) claimSlots(slots chan struct{}) int {
	select {
	case slots <- struct{}{}:
	case <-w.loopCtx.Done():
		return 0
	}
	free := 1
	for free < cap(slots) {
		select {
		case slots <- struct{}{}:
			free++
		default:
			return free
		}
	}
	return free
}

// dispatchBatch hands every message of batch to dispatch, each in one of
// the slots the caller holds, and returns how many came and the pull's
// error.
func (w *Worker) dispatchBatch(batch jetstream.MessageBatch, slots chan struct{}, dispatch func(jetstream.Msg)) (got int, err error) {
	for msg := range batch.Messages() {
		got++
		if w.loopCtx.Err() != nil {
			// Stopping: hand it straight back rather than start it.
			_ = msg.Nak()
			<-slots
			continue
		}
		dispatch(msg)
	}
	return got, batch.Error()
}

// pullFailed reports whether err is a failed pull of p, not one of its
// normal ends nor the worker stopping; it logs it and recreates p's
// consumer if it was deleted. The caller decides whether to pause.
func (w *Worker) pullFailed(p *pull, err error) bool {
	if err == nil || isFetchEnd(err) || w.loopCtx.Err() != nil {
		return false
	}
	log := w.log.With(slog.String("consumer", p.cfg.Durable))
	log.Warn("pull failed; trying again", slog.Any("error", err))
	w.recreateIfDeleted(p, log)
	return true
}

// isFetchEnd reports the normal ends of a pull: it timed out, was
// cancelled, or found nothing.
func isFetchEnd(err error) bool {
	return errors.Is(err, context.DeadlineExceeded) || errors.Is(err, context.Canceled) ||
		errors.Is(err, jetstream.ErrNoMessages) || errors.Is(err, jetstream.ErrNoHeartbeat)
}

// attemptResult is how one run of a handler ended.
type attemptResult struct {
	err         error
	outcome     string
	timeout     time.Duration
	interrupted bool
	// hold is the valid hold the handler returned (outcome held).
	hold *HoldError
	// returned is closed when the handler goroutine has returned; a handler
	// that overran its timeout and grace may still be running.
	returned <-chan struct{}
}

// process runs one job message: decode, run the handler with heartbeats,
// publish the outcome, then ack. Publishing before the ack means a crash
// in between redelivers the job; the scheduler's inbox and the outcome's
// Nats-Msg-Id absorb the repeated report.
func (w *Worker) process(p *pull, jobType string, h Handler, msg jetstream.Msg) {
	_, data, err := contract.DecodeJob(msg.Subject(), msg.Data())
	if err == nil {
		err = nameFired(&data, msg)
	}
	if err != nil {
		w.terminate(p.cfg.Durable, msg, err)
		return
	}
	log := w.jobLog(data)
	if w.alreadyDone(p, msg, data.ID, data.Attempt, log) {
		_ = msg.Ack()
		return
	}
	tctx, span := tracing.StartConsume(context.Background(), msg.Subject(), ConsumerName(jobType), msg.Headers(),
		attribute.String("retryd.job_type", data.JobType), attribute.String("retryd.id", data.ID), attribute.Int("retryd.attempt", data.Attempt))
	defer span.End()
	stopBeat := w.heartbeat(msg, log)
	defer stopBeat()

	job := newJob(data)
	timeout := w.cfg.Timeout
	if data.TimeoutMS > 0 {
		timeout = time.Duration(data.TimeoutMS) * time.Millisecond
	}
	w.m.inflight.WithLabelValues(jobType).Inc()
	start := time.Now()
	res := w.runHandler(tctx, h, job, timeout, log)
	w.m.inflight.WithLabelValues(jobType).Dec()
	w.m.attempts.WithLabelValues(jobType, res.outcome).Inc()
	w.m.duration.WithLabelValues(jobType, res.outcome).Observe(time.Since(start).Seconds())

	if res.interrupted {
		// Forced stop: no outcome, the job goes back to the broker as is.
		if err := msg.Nak(); err != nil {
			log.Debug("nak of interrupted job failed; the broker redelivers it after the ack wait", slog.Any("error", err))
		}
		log.Warn("job interrupted by stop; handed back for redelivery")
		return
	}

	var out *outcomeMsg
	switch {
	case res.err == nil:
		out, err = w.succeededMsg(data)
	case res.hold != nil:
		out, err = w.heldMsg(data, job.checkpoint(), res.hold)
	default:
		out, err = w.failedMsg(data, job.checkpoint(), res)
	}
	if err != nil {
		// Only an internal bug gets here: the job decoded and validated.
		log.Error("build outcome failed; terminating job", slog.String("reason", contract.LogReason(err)))
		_ = msg.TermWithReason("worker could not build outcome: " + contract.LogReason(err))
		return
	}
	if res.hold == nil {
		// A hold is waiting, not an error: the span stays unmarked.
		tracing.Fail(span, res.err)
	}
	tracing.Inject(tctx, out.msg.Header) // the scheduler continues this attempt's trace
	if err := w.publishOutcome(data, out); err != nil {
		log.Warn("publish outcome failed; job redelivered for another attempt", slog.Any("error", err), slog.String("event", out.event))
		_ = msg.NakWithDelay(fetchBackoff)
		return
	}
	ackCtx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
	if err := msg.DoubleAck(ackCtx); err != nil {
		// The outcome is published; a redelivery runs the attempt again
		// and its report is dropped as a duplicate.
		log.Warn("ack failed after outcome was published", slog.Any("error", err))
	}
	cancel()
	level, attrs := slog.LevelInfo, []slog.Attr{slog.String("event", out.event), slog.Duration("took", time.Since(start))}
	switch {
	case res.hold != nil:
		// Not the detail: like an error message, it may quote the input.
		attrs = append(attrs, slog.String("reason", out.class), slog.Duration("hold_for", res.hold.After))
	case res.err != nil:
		level, attrs = slog.LevelWarn, append(attrs, slog.String("class", out.class))
	}
	log.LogAttrs(context.Background(), level, "job attempt reported", attrs...)
	// Keep the slot until a handler that overran its grace returns, so
	// that Concurrency bounds running handlers, not just reported ones.
	select {
	case <-res.returned:
	case <-w.hardCtx.Done():
	}
}

// jobLog is the logger of one attempt: ids and type only, so that no
// payload or checkpoint reaches a log.
func (w *Worker) jobLog(d contract.JobData) *slog.Logger {
	return w.log.With(slog.String("job_id", d.ID), slog.String("job_type", d.JobType), slog.Int("attempt", d.Attempt))
}

// runHandler calls h with a timeout, converting panics to errors. A handler
// that ignores its context past the timeout plus Config.Grace is reported
// as timed out while it keeps running.
// tctx carries the attempt's span into the handler's ctx (cancellation
// comes from the worker alone).
func (w *Worker) runHandler(tctx context.Context, h Handler, job *Job, timeout time.Duration, log *slog.Logger) attemptResult {
	ctx, cancel := context.WithTimeout(trace.ContextWithSpan(w.hardCtx, trace.SpanFromContext(tctx)), timeout)
	defer cancel()
	done := make(chan error, 1)
	returned := make(chan struct{})
	go func() {
		defer close(returned)
		done <- callHandler(ctx, h, job)
	}()
	var err error
	select {
	case err = <-done:
	case <-ctx.Done():
		select {
		case err = <-done:
		case <-time.After(w.cfg.Grace):
			err = fmt.Errorf("handler did not return within %s after its context ended: %w", w.cfg.Grace, ctx.Err())
			log.Error("handler ignores its context; reporting the attempt while it still runs", slog.Duration("timeout", timeout))
		}
	}
	res := attemptResult{err: err, timeout: timeout, returned: returned}
	var p *panicError
	hold, held := AsHold(err)
	switch {
	case err == nil:
		res.outcome = outcomeSucceeded
	case w.hardCtx.Err() != nil:
		res.outcome, res.interrupted = outcomeInterrupted, true
	case errors.As(err, &p):
		res.outcome = outcomePanicked
		log.Error("handler panicked", slog.String("stack", p.stack))
	case held && hold.Validate() == nil:
		// Before the timeout check: a handler that decided to hold as its
		// time ran out still decided; the hold is its answer.
		res.outcome, res.hold = outcomeHeld, hold
	case errors.Is(ctx.Err(), context.DeadlineExceeded):
		res.outcome = outcomeTimedOut
	default:
		res.outcome = outcomeFailed
	}
	return res
}

// panicError is a recovered handler panic.
type panicError struct {
	value any
	stack string
}

func (p *panicError) Error() string { return fmt.Sprintf("handler panicked: %v", p.value) }

func callHandler(ctx context.Context, h Handler, job *Job) (err error) {
	defer func() {
		if v := recover(); v != nil {
			err = &panicError{value: v, stack: string(debug.Stack())}
		}
	}()
	return h(ctx, job)
}

// heartbeat tells the broker every AckWait/3 that the job is still being
// worked on, until the returned func is called.
func (w *Worker) heartbeat(msg jetstream.Msg, log *slog.Logger) func() {
	stop := make(chan struct{})
	go func() {
		t := time.NewTicker(w.cfg.AckWait / 3)
		defer t.Stop()
		for {
			select {
			case <-t.C:
				if err := msg.InProgress(); err != nil {
					log.Debug("in-progress ack failed", slog.Any("error", err))
				}
			case <-stop:
				return
			}
		}
	}()
	return func() { close(stop) }
}

// terminate ends a message that can never be processed and counts it.
func (w *Worker) terminate(consumer string, msg jetstream.Msg, err error) {
	w.m.malformed.WithLabelValues(consumer).Inc()
	reason := "malformed: " + contract.LogReason(err)
	seq := uint64(0)
	if md, mdErr := msg.Metadata(); mdErr == nil {
		seq = md.Sequence.Stream
	}
	w.log.Warn("terminating malformed message", slog.String("consumer", consumer), slog.String("subject", msg.Subject()), slog.Uint64("stream_seq", seq), slog.String("reason", reason))
	if err := msg.TermWithReason(reason); err != nil {
		w.log.Warn("term failed", slog.Any("error", err), slog.String("consumer", consumer))
	}
}

// nameFired gives a job fired by a periodic schedule the id of its tick
// (contract.FiredJobID), from the message's sequence in JOBS.
func nameFired(d *contract.JobData, msg jetstream.Msg) error {
	if msg.Headers().Get(contract.HeaderScheduler) == "" {
		return nil
	}
	meta, err := msg.Metadata()
	if err != nil {
		return fmt.Errorf("read fired job metadata: %w", err)
	}
	return d.NameFired(msg.Headers(), meta.Sequence.Stream)
}
