package jobs

import (
	"context"
	"errors"
	"fmt"
	"slices"
	"strings"
	"sync"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgconn"
	"github.com/jackc/pgx/v5/pgxpool"
	"github.com/nats-io/nats.go/jetstream"
	"github.com/prometheus/client_golang/prometheus"
	"github.com/rs/zerolog"

	"github.com/retryd/retryd/internal/durable"
	"github.com/retryd/retryd/internal/failpoint"
	"github.com/retryd/retryd/internal/inbox"
	"github.com/retryd/retryd/internal/wait"
	"github.com/retryd/retryd/pkg/contract"
	"github.com/retryd/retryd/pkg/tracing"
	"github.com/retryd/retryd/stores/jobstore"
)

// ProjectionDurable is the durable consumer name of the projection on both
// streams (JOBS and RETRIES) and its inbox consumer name.
const ProjectionDurable = "jobs-projection"

// Defaults of ProjectorConfig.
const (
	DefaultBatch     = 100
	DefaultAckWait   = 30 * time.Second
	DefaultFetchWait = 5 * time.Second
	// DefaultInboxRetention is how long applied message ids are kept.
	DefaultInboxRetention = 7 * 24 * time.Hour
	// pruneInterval is how often old inbox claims are deleted.
	pruneInterval = time.Hour
)

// retryFilters are the lifecycle events of jobs the projection folds; due
// events change nothing (the job message routed from them does).
var retryFilters = []string{
	contract.RetryFilter(contract.KindJob, contract.Failed),
	contract.RetryFilter(contract.KindJob, contract.Held),
	contract.RetryFilter(contract.KindJob, contract.Scheduled),
	contract.RetryFilter(contract.KindJob, contract.Rescheduled),
	contract.RetryFilter(contract.KindJob, contract.Succeeded),
	contract.RetryFilter(contract.KindJob, contract.Exhausted),
	contract.RetryFilter(contract.KindJob, contract.Cancelled),
}

// ProjectorConfig configures a Projector. Pool and JS are required.
type ProjectorConfig struct {
	Pool *pgxpool.Pool
	JS   jetstream.JetStream
	// Logger gets ids, types, attempts and counts; never payloads,
	// checkpoints or error messages.
	Logger zerolog.Logger
	// Registerer receives the retryd_jobs_* metrics; nil means a private
	// registry.
	Registerer prometheus.Registerer
	// Batch is how many messages one transaction applies. Default 100.
	Batch int
	// AckWait is the consumers' ack wait. Default 30s.
	AckWait time.Duration
	// FetchWait is how long one pull request waits for messages (at
	// least 1s: the client's minimum). Default 5s.
	FetchWait time.Duration
	// InboxRetention is how long the projection's applied message ids are
	// kept in the inbox (pruned hourly); it must outlast redeliveries.
	// Default 7 days; negative keeps them forever.
	InboxRetention time.Duration
	// Failpoint is for tests: it is called at FailpointProjectorCommitted,
	// after a batch's transaction committed and before its messages are
	// acked. An error leaves them unacked, as if the process died there:
	// they are redelivered after AckWait and dropped by the inbox.
	Failpoint failpoint.Func
}

// FailpointProjectorCommitted names the one place where
// ProjectorConfig.Failpoint is consulted.
const FailpointProjectorCommitted = "projector.committed"

func (c *ProjectorConfig) validate() error {
	switch {
	case c.Pool == nil:
		return errors.New("ProjectorConfig.Pool is required")
	case c.JS == nil:
		return errors.New("ProjectorConfig.JS is required")
	case c.Batch < 0 || c.Batch > 10_000:
		return fmt.Errorf("ProjectorConfig.Batch must be between 1 and 10000, got %d", c.Batch)
	case c.AckWait < 0:
		return fmt.Errorf("ProjectorConfig.AckWait must not be negative, got %s", c.AckWait)
	case c.FetchWait < 0:
		return fmt.Errorf("ProjectorConfig.FetchWait must not be negative, got %s", c.FetchWait)
	}
	if c.Batch == 0 {
		c.Batch = DefaultBatch
	}
	if c.AckWait == 0 {
		c.AckWait = DefaultAckWait
	}
	if c.FetchWait == 0 {
		c.FetchWait = DefaultFetchWait
	}
	if c.InboxRetention == 0 {
		c.InboxRetention = DefaultInboxRetention
	}
	if c.InboxRetention > 0 && c.InboxRetention < time.Hour {
		return fmt.Errorf("ProjectorConfig.InboxRetention must be at least 1h (it must outlast redeliveries), got %s", c.InboxRetention)
	}
	if c.Registerer == nil {
		c.Registerer = prometheus.NewRegistry()
	}
	return nil
}

// Projector folds the JOBS stream (jobs.<job_type>: an attempt is queued)
// and the job lifecycle events on RETRIES (retry.job.<event>.<id>) into the
// jobs table. Each batch is applied in one transaction that also claims
// every message in the inbox, so a redelivered message changes nothing;
// the fold itself is ordering-safe (see package jobstore), so the two
// streams may run ahead of each other.
type Projector struct {
	cfg ProjectorConfig
	log zerolog.Logger
	m   *projectorMetrics

	lifecycle
	consumers *durable.Group
	loops     sync.WaitGroup
}

// NewProjector validates cfg and returns a Projector.
func NewProjector(cfg ProjectorConfig) (*Projector, error) {
	if err := cfg.validate(); err != nil {
		return nil, fmt.Errorf("new jobs projector: %w", err)
	}
	m, err := newProjectorMetrics(cfg.Registerer)
	if err != nil {
		return nil, fmt.Errorf("new jobs projector: %w", err)
	}
	return &Projector{cfg: cfg, log: cfg.Logger.With().Str("component", "jobs-projection").Logger(), m: m}, nil
}

// Start creates or updates the durable consumers and starts folding. ctx
// bounds the setup; Stop ends the projector.
func (p *Projector) Start(ctx context.Context) error {
	return p.start("jobs projector", func(loops context.Context) error {
		return p.startConsumers(ctx, loops)
	})
}

// startConsumers starts the consumers (ctx bounds their setup) and the
// inbox pruning, which runs until loops ends.
func (p *Projector) startConsumers(ctx, loops context.Context) error {
	spec := func(stream string) durable.Spec {
		log := p.log.With().Str("stream", stream).Logger()
		return durable.Spec{
			Stream: stream, Config: p.consumerConfig(stream), Batch: p.cfg.Batch, Expiry: p.cfg.FetchWait,
			HandleBatch: func(ctx context.Context, msgs []jetstream.Msg) error {
				return p.handleBatch(ctx, stream, msgs, log)
			},
		}
	}
	// Config.Streams is nil: the projection's user may not create streams;
	// a consumer on a deleted stream is recreated once the stream is back.
	consumers, err := durable.NewGroup(durable.Config{JS: p.cfg.JS, Logger: p.log},
		spec(contract.StreamJobs), spec(contract.StreamRetries))
	if err != nil {
		return err
	}
	if err := consumers.Start(ctx); err != nil {
		return err
	}
	p.consumers = consumers
	if p.cfg.InboxRetention > 0 {
		p.loops.Add(1)
		go p.pruneInbox(loops)
	}
	p.log.Info().Msg("jobs projection started")
	return nil
}

// consumerConfig is the durable consumer of the projection on stream.
func (p *Projector) consumerConfig(stream string) jetstream.ConsumerConfig {
	cfg := jetstream.ConsumerConfig{
		Durable:       ProjectionDurable,
		DeliverPolicy: jetstream.DeliverAllPolicy,
		AckPolicy:     jetstream.AckExplicitPolicy,
		AckWait:       p.cfg.AckWait,
		MaxAckPending: 4 * p.cfg.Batch,
		MaxDeliver:    -1,
	}
	if stream == contract.StreamJobs {
		cfg.Description = "retryd jobs projection: attempts queued"
		// Every priority band: jobs.<job_type>, jobs.<job_type>.high, .low.
		cfg.FilterSubject = "jobs.>"
	} else {
		cfg.Description = "retryd jobs projection: job lifecycle"
		cfg.FilterSubjects = retryFilters
	}
	return cfg
}

// Stop drains the consumers and waits for the batches being applied
// (their transactions are committed or rolled back, their messages acked
// or handed back). It is idempotent; ctx bounds the wait.
func (p *Projector) Stop(ctx context.Context) error {
	if !p.stop() {
		return nil
	}
	// The batches already delivered are applied even while stopping:
	// finishing them is quicker than their redelivery.
	drainErr := p.consumers.Drain(ctx)
	if err := wait.Group(ctx, &p.loops); err != nil {
		return fmt.Errorf("stop jobs projector: %w", err)
	}
	if drainErr != nil {
		return fmt.Errorf("stop jobs projector: %w", drainErr)
	}
	p.log.Info().Msg("jobs projection stopped")
	return nil
}

// handleBatch is the batch handler of the consumer on stream. A batch that
// failed was handed back (nak) by applyBatch; its error makes the consumer
// runtime pause before the next one (100ms, doubling up to 5s).
func (p *Projector) handleBatch(ctx context.Context, stream string, msgs []jetstream.Msg, log zerolog.Logger) error {
	err := p.applyBatch(ctx, stream, msgs, log)
	if err != nil && !errors.Is(err, durable.ErrAbandon) {
		log.Warn().Err(err).Int("messages", len(msgs)).Msg("apply batch failed; handed back for redelivery")
	}
	return err
}

// decoded is a message ready to apply.
type decoded struct {
	msg   jetstream.Msg
	msgID string
	job   *contract.JobData
	at    time.Time
	ev    *contract.LifecycleEvent
}

func (d decoded) jobID() string {
	if d.job != nil {
		return d.job.ID
	}
	return d.ev.ID
}

// applyBatch decodes msgs, terminates the malformed ones and applies the
// others in one transaction; after the commit it acks them. On an error
// it hands back (naks) what it could not apply and returns the error.
//
// A message the database refuses (a data or constraint error) would fail
// every batch it is in, and the projection would apply nothing more: when
// a batch is refused, its messages are applied one by one and the refused
// ones are terminated and counted as malformed.
func (p *Projector) applyBatch(ctx context.Context, stream string, msgs []jetstream.Msg, log zerolog.Logger) error {
	var good []decoded
	for _, m := range msgs {
		d, err := decode(stream, m)
		if err != nil {
			p.terminate(stream, m, err, log)
			continue
		}
		good = append(good, d)
	}
	if len(good) == 0 {
		return nil
	}
	// One consumer span per message, continuing its trace, for the batch.
	for _, d := range good {
		_, span := tracing.StartConsume(ctx, d.msg.Subject(), ProjectionDurable, d.msg.Headers())
		defer span.End()
	}
	err := p.apply(ctx, stream, good, log)
	if err == nil || !refused(err) {
		return err
	}
	var firstErr, abandoned error
	for _, d := range good {
		err := p.apply(ctx, stream, []decoded{d}, log)
		switch {
		case err == nil:
		case errors.Is(err, durable.ErrAbandon):
			abandoned = err
		case refused(err):
			p.terminate(stream, d.msg, err, log)
		case firstErr == nil:
			firstErr = err
		}
	}
	// The messages a failpoint left are the only ones not settled: the
	// abandon leaves them unacked.
	return errors.Join(firstErr, abandoned)
}

// apply applies ds in one transaction that claims each in the inbox, then
// acks them. On an error it naks them, unless the database refused them:
// the caller settles those. A failpoint's error leaves them unsettled.
func (p *Projector) apply(ctx context.Context, stream string, ds []decoded, log zerolog.Logger) error {
	// The JOBS and RETRIES consumers apply batches at once, often to the
	// same jobs: each locks its rows in job id order, or two batches could
	// each hold a row the other waits for. The fold does not depend on the
	// order of facts (see jobstore), and the sort is stable anyway.
	ds = slices.Clone(ds)
	slices.SortStableFunc(ds, func(a, b decoded) int { return strings.Compare(a.jobID(), b.jobID()) })
	applied, dups := 0, 0
	err := pgx.BeginFunc(ctx, p.cfg.Pool, func(tx pgx.Tx) error {
		applied, dups = 0, 0
		for _, d := range ds {
			first, err := inbox.Claim(ctx, tx, ProjectionDurable, d.msgID)
			if err != nil {
				return err
			}
			if !first {
				dups++
				continue
			}
			if d.job != nil {
				err = jobstore.ApplyJob(ctx, tx, *d.job, d.at)
			} else {
				err = jobstore.ApplyLifecycle(ctx, tx, *d.ev)
			}
			if err != nil {
				return err
			}
			applied++
		}
		return nil
	})
	if err != nil {
		p.m.errors.WithLabelValues(stream).Inc()
		if !refused(err) {
			for _, d := range ds {
				_ = d.msg.NakWithDelay(time.Second)
			}
		}
		return err
	}
	p.m.applied.WithLabelValues(stream).Add(float64(applied))
	p.m.duplicates.WithLabelValues(stream).Add(float64(dups))
	if err := p.cfg.Failpoint.At(ctx, FailpointProjectorCommitted); err != nil {
		// The error wraps durable.ErrAbandon: the runtime leaves the
		// messages unacked.
		log.Warn().Err(err).Msg("leaving the batch unacked")
		return err
	}
	for _, d := range ds {
		if err := d.msg.Ack(); err != nil {
			// Redelivered later and dropped by the inbox.
			log.Debug().Err(err).Msg("ack after commit failed")
		}
	}
	return nil
}

// refused reports whether Postgres refused the data itself (SQLSTATE
// classes 22, data exception, and 23, integrity constraint violation):
// applying the same message again cannot work.
func refused(err error) bool {
	var pgErr *pgconn.PgError
	return errors.As(err, &pgErr) && (strings.HasPrefix(pgErr.Code, "22") || strings.HasPrefix(pgErr.Code, "23"))
}

// terminate ends a message that can never be applied and counts it.
func (p *Projector) terminate(stream string, m jetstream.Msg, err error, log zerolog.Logger) {
	p.m.malformed.WithLabelValues(stream).Inc()
	reason := "malformed: " + contract.LogReason(err)
	log.Warn().Str("subject", m.Subject()).Str("reason", reason).Msg("terminating malformed message")
	if termErr := m.TermWithReason(reason); termErr != nil {
		log.Warn().Err(termErr).Msg("term failed")
	}
}

func decode(stream string, m jetstream.Msg) (decoded, error) {
	d := decoded{msg: m, msgID: m.Headers().Get(contract.HeaderMsgID)}
	if stream == contract.StreamJobs {
		env, job, err := contract.DecodeJob(m.Subject(), m.Data())
		if err != nil {
			return decoded{}, err
		}
		if m.Headers().Get(contract.HeaderScheduler) != "" {
			// A schedule fired it: the server dropped the Nats-Msg-Id,
			// and a periodic schedule's ticks share one body.
			meta, err := m.Metadata()
			if err != nil {
				return decoded{}, fmt.Errorf("read fired job metadata: %w", err)
			}
			if err := job.NameFired(m.Headers(), meta.Sequence.Stream); err != nil {
				return decoded{}, err
			}
			d.msgID = contract.JobMsgID(job.ID, job.Attempt)
		}
		d.job, d.at = &job, env.Time
		if d.msgID == "" {
			d.msgID = env.ID
		}
		return d, nil
	}
	ev, err := contract.DecodeLifecycle(m.Subject(), m.Data())
	if err != nil {
		return decoded{}, err
	}
	d.ev = &ev
	if d.msgID == "" {
		d.msgID = ev.Envelope.ID
	}
	return d, nil
}

// pruneInbox deletes the projection's inbox claims older than
// InboxRetention, at start and hourly; older redeliveries are caught by the
// fold's ordering guards.
func (p *Projector) pruneInbox(ctx context.Context) {
	defer p.loops.Done()
	wait.Every(ctx, pruneInterval, func() {
		n, err := inbox.Prune(ctx, p.cfg.Pool, p.cfg.InboxRetention, ProjectionDurable)
		if err != nil && ctx.Err() == nil {
			p.log.Warn().Err(err).Msg("prune inbox")
		} else if n > 0 {
			p.log.Debug().Int64("pruned", n).Msg("pruned inbox")
		}
	})
}
