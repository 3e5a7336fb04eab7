package worker

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"sort"
	"sync"
	"time"

	"github.com/nats-io/nats.go/jetstream"

	"github.com/retryd/retryd/pkg/contract"
	"github.com/retryd/retryd/pkg/owner"
)

// ErrStarted is returned by Handle after Start, and by Start after Start or
// Stop.
var ErrStarted = errors.New("worker already started")

// Worker runs handlers for job types. Build it with New, register handlers
// with Handle, then Start; Stop drains it.
type Worker struct {
	cfg Config
	log *slog.Logger
	m   *metrics

	mu       sync.Mutex
	handlers map[string]Handler
	started  bool

	// loopCtx ends the fetch loops (Stop); hardCtx also cancels running
	// handlers (Stop's deadline passed).
	loopCtx    context.Context
	loopCancel context.CancelFunc
	hardCtx    context.Context
	hardCancel context.CancelFunc
	loops      sync.WaitGroup
	inflight   sync.WaitGroup

	// reporter publishes the outcomes and keeps the failed and held facts
	// until their decision (the owner runtime's, pkg/owner); set by Start.
	reporter *owner.Reporter
	rm       *owner.ReporterMetrics
	facts    owner.Facts

	stopOnce sync.Once
	stopped  chan struct{}
	stopErr  error
}

// New validates cfg, fills its defaults and returns a Worker with no
// handlers.
func New(cfg Config) (*Worker, error) {
	if err := cfg.validate(); err != nil {
		return nil, fmt.Errorf("new worker: %w", err)
	}
	m, err := newMetrics(cfg.Registerer)
	if err != nil {
		return nil, fmt.Errorf("new worker: %w", err)
	}
	rm, err := owner.NewReporterMetrics(cfg.Registerer, "worker")
	if err != nil {
		return nil, fmt.Errorf("new worker: %w", err)
	}
	log := cfg.Logger.With(slog.String("component", "worker"))
	w := &Worker{
		cfg:      cfg,
		log:      log,
		m:        m,
		rm:       rm,
		facts:    owner.Facts{Source: cfg.Source, Executor: cfg.ExecutorID, Now: cfg.Now, Logger: log},
		handlers: map[string]Handler{},
		stopped:  make(chan struct{}),
	}
	w.loopCtx, w.loopCancel = context.WithCancel(context.Background())
	w.hardCtx, w.hardCancel = context.WithCancel(context.Background())
	return w, nil
}

// Handle registers the handler of a job type. It must be called before
// Start. The handler's error decides what happens next:
//   - nil: retry.job.succeeded.<id> is published.
//   - a *HoldError (Hold): retry.job.held.<id> is published; the job waits
//     without using a retry (see HoldError).
//   - an *errclass.Error (errclass.New, Wrap, RetryAfter, NonRetryable):
//     its class, retry-after hint and non-retryable flag are reported.
//   - any other error: Config.Classifier classifies its message.
//   - a handler that overruns its timeout reports class timeout; a panic
//     reports class temporary.
func (w *Worker) Handle(jobType string, h Handler) error {
	if err := contract.ValidateToken("jobType", jobType); err != nil {
		return fmt.Errorf("handle job type: %w", err)
	}
	if len(jobType) > contract.MaxTokenLen-len("worker-") {
		return fmt.Errorf("handle job type: %w", &contract.FieldError{Field: "jobType", Reason: "is too long for a consumer name", Err: contract.ErrInvalid})
	}
	if h == nil {
		return errors.New("handle job type: handler is nil")
	}
	w.mu.Lock()
	defer w.mu.Unlock()
	if w.started {
		return fmt.Errorf("handle job type %s: %w", jobType, ErrStarted)
	}
	if _, dup := w.handlers[jobType]; dup {
		return fmt.Errorf("handle job type %s: a handler is already registered", jobType)
	}
	w.handlers[jobType] = h
	return nil
}

// JobTypes lists the registered job types, sorted.
func (w *Worker) JobTypes() []string {
	w.mu.Lock()
	defer w.mu.Unlock()
	out := make([]string, 0, len(w.handlers))
	for t := range w.handlers {
		out = append(out, t)
	}
	sort.Strings(out)
	return out
}

// ConsumerName is the durable consumer of a job type: "worker-<job_type>".
func ConsumerName(jobType string) string { return "worker-" + jobType }

// Start creates or updates the durable consumers (on JOBS, one per
// priority band of every registered type: worker-<job_type> for the
// normal band, worker-<job_type>=high and worker-<job_type>=low; on
// RETRIES, worker-due-router unless disabled) and starts consuming. ctx bounds the setup only; Stop ends the worker.
func (w *Worker) Start(ctx context.Context) error {
	w.mu.Lock()
	if w.started || w.loopCtx.Err() != nil {
		w.mu.Unlock()
		return ErrStarted
	}
	w.started = true
	types := make([]string, 0, len(w.handlers))
	for t := range w.handlers {
		types = append(types, t)
	}
	w.mu.Unlock()
	sort.Strings(types)
	if len(types) == 0 && w.cfg.DisableDueRouter {
		return errors.New("start worker: no handlers and the due router is disabled: nothing to run")
	}

	pulls := make(map[string][]*pull, len(types))
	for _, t := range types {
		for _, prio := range contract.Priorities {
			p, err := w.newPull(ctx, contract.StreamJobs, jetstream.ConsumerConfig{
				Durable:       BandConsumerName(t, prio),
				Description:   "retryd worker SDK: runs " + string(prio) + " priority jobs of type " + t,
				FilterSubject: contract.JobSubjectFor(t, prio),
				DeliverPolicy: jetstream.DeliverAllPolicy,
				AckPolicy:     jetstream.AckExplicitPolicy,
				AckWait:       w.cfg.AckWait,
				MaxAckPending: w.cfg.MaxAckPending,
				// Never give up on a job: a message the broker dropped after N
				// deliveries would be a lost job. Poison jobs fail and go
				// through the retry policy instead.
				MaxDeliver: -1,
			})
			if err != nil {
				return err
			}
			pulls[t] = append(pulls[t], p)
		}
	}
	var router *pull
	if !w.cfg.DisableDueRouter {
		var err error
		router, err = w.newPull(ctx, contract.StreamRetries, jetstream.ConsumerConfig{
			Durable:       DueRouterDurable,
			Description:   "retryd worker SDK: republishes retry.job.due.<id> as jobs.<job_type>",
			FilterSubject: contract.RetryFilter(contract.KindJob, contract.Due),
			DeliverPolicy: jetstream.DeliverAllPolicy,
			AckPolicy:     jetstream.AckExplicitPolicy,
			AckWait:       w.cfg.AckWait,
			MaxAckPending: 1024,
			MaxDeliver:    -1,
		})
		if err != nil {
			return err
		}
	}

	// RepublishAfter is checked against the duplicate window RETRIES
	// has, not the one it should have.
	rep, err := owner.NewReporter(ctx, owner.ReporterConfig{
		JS: w.cfg.JS, Kind: contract.KindJob, PendingLimit: w.cfg.PendingLimit, RepublishAfter: w.cfg.RepublishAfter,
		Metrics: w.rm, Logger: w.log, Now: w.cfg.Now,
	})
	if err != nil {
		return fmt.Errorf("start worker: %w", err)
	}
	w.reporter = rep

	for _, t := range types {
		w.loops.Add(1)
		go w.consumeJobs(t, w.handlers[t], pulls[t])
	}
	if router != nil {
		w.loops.Add(1)
		go w.consumeDues(router)
	}
	w.log.Info("worker started", slog.Any("job_types", types), slog.Bool("due_router", router != nil), slog.Int("concurrency", w.cfg.Concurrency),
		slog.Int("pending_limit", w.cfg.PendingLimit), slog.Duration("republish_after", rep.RepublishAfter()))
	return nil
}

// Stop stops fetching, waits for running handlers to finish and report,
// and returns. If ctx ends first, running handlers are cancelled and their
// jobs are handed back to the broker (nak) without an outcome, to be run
// again by this or another worker; Stop then returns ctx's error. Stop is
// idempotent.
func (w *Worker) Stop(ctx context.Context) error {
	w.stopOnce.Do(func() {
		defer close(w.stopped)
		w.loopCancel()
		w.loops.Wait()
		done := make(chan struct{})
		go func() {
			w.inflight.Wait()
			close(done)
		}()
		select {
		case <-done:
		case <-ctx.Done():
			w.hardCancel()
			w.stopErr = fmt.Errorf("stop worker: running handlers interrupted: %w", ctx.Err())
			// Interrupted handlers nak their jobs as soon as they return;
			// give them a moment so the jobs are redelivered at once
			// rather than after AckWait.
			select {
			case <-done:
			case <-time.After(w.cfg.Grace):
			}
		}
		w.hardCancel()
		if w.reporter != nil {
			if n := w.reporter.Close(); n > 0 {
				// Their facts are on RETRIES for the scheduler to read;
				// only a purge before it does loses them.
				w.log.Warn("worker stopped with facts the scheduler has not decided; no longer kept", slog.Int("pending", n))
			}
		}
		w.log.Info("worker stopped")
	})
	<-w.stopped
	return w.stopErr
}
