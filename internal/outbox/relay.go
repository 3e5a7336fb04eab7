package outbox

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"sync"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgxpool"
	"github.com/nats-io/nats.go"
	"github.com/nats-io/nats.go/jetstream"
	"github.com/prometheus/client_golang/prometheus"
	"github.com/rs/zerolog"

	"github.com/retryd/retryd/internal/failpoint"
)

// RelayConfig configures a Relay. Pool, JS and Owner are required.
type RelayConfig struct {
	Pool *pgxpool.Pool
	JS   jetstream.JetStream
	// Owner selects the rows this relay publishes: the owner given to
	// Insert, normally the service name.
	Owner  string
	Logger zerolog.Logger
	// Batch is how many rows one transaction locks and publishes. Default 256.
	Batch int
	// Interval is how often the relay looks for rows when nobody calls
	// Kick: the fallback that publishes rows committed by a process that
	// crashed before kicking. Default 1s.
	Interval time.Duration
	// Registerer receives the relay's metrics; nil registers nothing.
	Registerer prometheus.Registerer
	// AckTimeout bounds the wait for a batch's PubAcks; messages without an
	// ack by then stay in the outbox and are published again. Default 10s.
	AckTimeout time.Duration
	// MaxBackoff caps the wait between attempts while nothing can be
	// published (NATS or Postgres down). The wait starts at Interval and
	// doubles. Default 30s.
	MaxBackoff time.Duration
}

func (c *RelayConfig) validate() error {
	switch {
	case c.Pool == nil:
		return errors.New("RelayConfig.Pool is required")
	case c.JS == nil:
		return errors.New("RelayConfig.JS is required")
	case c.Owner == "":
		return errors.New("RelayConfig.Owner is required")
	case c.Batch < 0:
		return fmt.Errorf("RelayConfig.Batch is %d, must not be negative", c.Batch)
	case c.Interval < 0:
		return fmt.Errorf("RelayConfig.Interval is %s, must not be negative", c.Interval)
	case c.AckTimeout < 0:
		return fmt.Errorf("RelayConfig.AckTimeout is %s, must not be negative", c.AckTimeout)
	case c.MaxBackoff < 0:
		return fmt.Errorf("RelayConfig.MaxBackoff is %s, must not be negative", c.MaxBackoff)
	}
	if c.Batch == 0 {
		c.Batch = 256
	}
	if c.Interval == 0 {
		c.Interval = time.Second
	}
	if c.AckTimeout == 0 {
		c.AckTimeout = 10 * time.Second
	}
	if c.MaxBackoff == 0 {
		c.MaxBackoff = 30 * time.Second
	}
	c.MaxBackoff = max(c.MaxBackoff, c.Interval)
	return nil
}

// Relay publishes one owner's outbox rows to JetStream and deletes them
// after their PubAck.
//
// Each batch is taken with SELECT ... FOR UPDATE SKIP LOCKED in a
// transaction held until the batch is published and deleted, so two relays
// of the same owner (two replicas of a service) never publish the same
// rows at the same time. Each relay publishes its batch in id order; with
// several relays per owner, batches may interleave.
type Relay struct {
	cfg     RelayConfig
	log     zerolog.Logger
	metrics *metrics
	kick    chan struct{}

	mu     sync.Mutex
	state  int // 0 new, 1 running, 2 stopped
	stop   chan struct{}
	done   chan struct{}
	cancel context.CancelFunc

	// failpoint, when set by a test, runs at failpointPublished: after a
	// batch was published and before its rows are deleted; an error makes
	// the relay behave as if it crashed there (the transaction rolls back,
	// the rows stay).
	failpoint failpoint.Func

	// observed is when observe last read the table (run's goroutine
	// only): at most once per observeEvery, since a relay kicked by every
	// commit passes many times a second and a count of a large outbox is
	// not free.
	observed time.Time
}

const observeEvery = time.Second

const failpointPublished = "outbox.published"

// NewRelay checks cfg, fills defaults and registers the metrics.
func NewRelay(cfg RelayConfig) (*Relay, error) {
	if err := cfg.validate(); err != nil {
		return nil, err
	}
	m, err := newMetrics(cfg.Registerer)
	if err != nil {
		return nil, err
	}
	return &Relay{
		cfg:     cfg,
		log:     cfg.Logger.With().Str("component", "outbox-relay").Str("owner", cfg.Owner).Logger(),
		metrics: m,
		kick:    make(chan struct{}, 1),
		stop:    make(chan struct{}),
		done:    make(chan struct{}),
	}, nil
}

// Start runs the relay until Stop is called or ctx is cancelled.
func (r *Relay) Start(ctx context.Context) error {
	r.mu.Lock()
	defer r.mu.Unlock()
	if r.state != 0 {
		return errors.New("start outbox relay: already started")
	}
	r.state = 1
	runCtx, cancel := context.WithCancel(ctx)
	r.cancel = cancel
	go r.run(runCtx)
	return nil
}

// Stop lets the batch in flight finish and stops the relay. If ctx ends
// first, the batch is abandoned (its rows stay and are published again
// later) and ctx's error returned. Stop is idempotent.
func (r *Relay) Stop(ctx context.Context) error {
	r.mu.Lock()
	switch r.state {
	case 0:
		r.state = 2
		r.mu.Unlock()
		return nil
	case 1:
		r.state = 2
		close(r.stop)
	}
	r.mu.Unlock()
	if r.cancel == nil {
		return nil
	}
	select {
	case <-r.done:
		r.cancel()
		return nil
	case <-ctx.Done():
		r.cancel()
		<-r.done
		return fmt.Errorf("stop outbox relay: %w", ctx.Err())
	}
}

// Kick wakes the relay now, e.g. right after a commit that inserted rows.
// It never blocks.
func (r *Relay) Kick() {
	select {
	case r.kick <- struct{}{}:
	default:
	}
}

// Flush publishes every row of the owner pending now, batch by batch, and
// returns how many it published. A row that fails to publish stays (with
// attempts and last_error updated) and is not retried by this call; the
// error says how many failed.
func (r *Relay) Flush(ctx context.Context) (int, error) {
	return r.flush(ctx, nil)
}

func (r *Relay) run(ctx context.Context) {
	defer close(r.done)
	var backoff time.Duration
	for {
		published, err := r.flush(ctx, r.stop)
		r.observe(ctx)
		wait := r.cfg.Interval
		switch {
		case err == nil || ctx.Err() != nil:
			backoff = 0
		case published > 0:
			// NATS and Postgres work; only some rows failed (e.g. a
			// subject no stream captures). Keep the normal pace.
			backoff = 0
			r.log.Warn().Err(err).Int("published", published).Msg("some outbox messages not published")
		default:
			backoff = min(max(backoff*2, r.cfg.Interval), r.cfg.MaxBackoff)
			wait = backoff
			r.log.Warn().Err(err).Dur("retry_in", wait).Msg("outbox relay cannot publish")
		}
		if !r.sleep(ctx, wait, backoff > 0) {
			return
		}
	}
}

// sleep waits for wait, a Kick (unless backingOff) or the end. It reports
// false when the relay must stop.
func (r *Relay) sleep(ctx context.Context, wait time.Duration, backingOff bool) bool {
	timer := time.NewTimer(wait)
	defer timer.Stop()
	for {
		select {
		case <-r.stop:
			return false
		case <-ctx.Done():
			return false
		case <-timer.C:
			return true
		case <-r.kick:
			if !backingOff {
				return true
			}
			// While NATS is unreachable, kicks must not turn the backoff
			// into a busy loop; the kicked rows go with the next attempt.
		}
	}
}

// flush publishes batches until one comes back short. Rows that failed are
// excluded from the later batches of the same call, so one bad row cannot
// make it spin. stop, when closed, ends it between batches.
func (r *Relay) flush(ctx context.Context, stop <-chan struct{}) (int, error) {
	var (
		total    int
		failed   []int64
		firstErr error
	)
	for {
		select {
		case <-stop:
			return total, firstErr
		default:
		}
		res, err := r.publishBatch(ctx, failed)
		total += res.published
		failed = append(failed, res.failed...)
		if err != nil {
			return total, err
		}
		if len(res.failed) > 0 && firstErr == nil {
			firstErr = fmt.Errorf("publish outbox messages: %d of %d failed, first (id %d): %w",
				len(res.failed), res.taken, res.failed[0], res.firstErr)
		}
		if res.taken < r.cfg.Batch {
			return total, firstErr
		}
	}
}

const selectBatchSQL = `
SELECT id, subject, msg_id, headers, payload, attempts
FROM outbox
WHERE owner = $1 AND id <> ALL(coalesce($3::bigint[], '{}'))
ORDER BY id
LIMIT $2
FOR UPDATE SKIP LOCKED`

type row struct {
	id       int64
	subject  string
	msgID    string
	headers  []byte
	payload  []byte
	attempts int
}

type batchResult struct {
	taken     int
	published int
	failed    []int64
	firstErr  error
}

// publishBatch locks up to Batch rows, publishes them asynchronously,
// waits for the PubAcks, deletes the acknowledged rows and records the
// failure on the others, all in one transaction.
func (r *Relay) publishBatch(ctx context.Context, exclude []int64) (batchResult, error) {
	var res batchResult
	tx, err := r.cfg.Pool.Begin(ctx)
	if err != nil {
		return res, fmt.Errorf("begin outbox batch: %w", err)
	}
	defer func() { _ = tx.Rollback(context.WithoutCancel(ctx)) }()

	rows, err := tx.Query(ctx, selectBatchSQL, r.cfg.Owner, r.cfg.Batch, exclude)
	if err != nil {
		return res, fmt.Errorf("select outbox batch: %w", err)
	}
	batch, err := pgx.CollectRows(rows, func(cr pgx.CollectableRow) (row, error) {
		var x row
		err := cr.Scan(&x.id, &x.subject, &x.msgID, &x.headers, &x.payload, &x.attempts)
		return x, err
	})
	if err != nil {
		return res, fmt.Errorf("select outbox batch: %w", err)
	}
	res.taken = len(batch)
	if len(batch) == 0 {
		return res, tx.Commit(ctx)
	}

	acked, dups, failedIDs, failedErrs := r.publish(ctx, batch)
	if ctx.Err() != nil {
		return res, fmt.Errorf("publish outbox batch: %w", ctx.Err())
	}
	if err := r.failpoint.At(ctx, failpointPublished); err != nil {
		return res, err
	}
	if len(acked) > 0 {
		// With the owner: the planner, seeing a queue table that is
		// often empty, may take outbox_owner_idx for this delete, and with
		// only id to match it reads that index whole for every id (tens
		// of milliseconds a batch once the table is large).
		if _, err := tx.Exec(ctx, "DELETE FROM outbox WHERE owner = $1 AND id = ANY($2)", r.cfg.Owner, acked); err != nil {
			return res, fmt.Errorf("delete published outbox rows: %w", err)
		}
	}
	if len(failedIDs) > 0 {
		msgs := make([]string, len(failedErrs))
		for i, e := range failedErrs {
			msgs[i] = e.Error()
		}
		_, err := tx.Exec(ctx, `
			UPDATE outbox o SET attempts = o.attempts + 1, last_error = f.err
			FROM unnest($1::bigint[], $2::text[]) AS f(id, err)
			WHERE o.id = f.id`, failedIDs, msgs)
		if err != nil {
			return res, fmt.Errorf("record outbox publish failures: %w", err)
		}
	}
	if err := tx.Commit(ctx); err != nil {
		// Published but not deleted: the rows are published again and
		// JetStream drops the repeats by Nats-Msg-Id.
		return res, fmt.Errorf("commit outbox batch: %w", err)
	}
	res.published = len(acked)
	res.failed = failedIDs
	if len(failedErrs) > 0 {
		res.firstErr = failedErrs[0]
	}
	r.metrics.published.WithLabelValues(r.cfg.Owner).Add(float64(len(acked)))
	r.metrics.duplicates.WithLabelValues(r.cfg.Owner).Add(float64(dups))
	r.metrics.errors.WithLabelValues(r.cfg.Owner).Add(float64(len(failedIDs)))
	r.log.Debug().Int("published", len(acked)).Int("duplicates", dups).Int("failed", len(failedIDs)).Msg("outbox batch")
	return res, nil
}

// publish sends the batch with PublishMsgAsync (in id order, so JetStream
// stores it in that order) and collects the PubAcks. A PubAck that marks a
// duplicate counts as published: the stream already holds the message.
func (r *Relay) publish(ctx context.Context, batch []row) (acked []int64, dups int, failedIDs []int64, failedErrs []error) {
	fail := func(x row, err error) {
		failedIDs = append(failedIDs, x.id)
		failedErrs = append(failedErrs, err)
	}
	futures := make([]jetstream.PubAckFuture, len(batch))
	// One deadline for the batch: past the connection's cap on outstanding
	// publishes a publish waits for PubAcks instead of failing, and once
	// one gives up the rest of the batch waits for the next pass.
	deadline := time.Now().Add(r.cfg.AckTimeout)
	stalled := false
	for i, x := range batch {
		if stalled {
			fail(x, jetstream.ErrTooManyStalledMsgs)
			continue
		}
		msg := &nats.Msg{Subject: x.subject, Data: x.payload}
		if err := json.Unmarshal(x.headers, &msg.Header); err != nil {
			fail(x, fmt.Errorf("decode stored headers: %w", err))
			continue
		}
		f, err := r.cfg.JS.PublishMsgAsync(msg, jetstream.WithStallWait(max(time.Until(deadline), time.Millisecond)))
		if err != nil {
			fail(x, err)
			stalled = errors.Is(err, jetstream.ErrTooManyStalledMsgs)
			continue
		}
		futures[i] = f
	}
	timeout := time.NewTimer(r.cfg.AckTimeout)
	defer timeout.Stop()
	expired := false
	ok := func(i int, ack *jetstream.PubAck) {
		acked = append(acked, batch[i].id)
		if ack.Duplicate {
			dups++
		}
	}
	for i, f := range futures {
		if f == nil {
			continue
		}
		if expired {
			// Take what has arrived; do not wait any longer.
			select {
			case ack := <-f.Ok():
				ok(i, ack)
			case err := <-f.Err():
				fail(batch[i], err)
			default:
				fail(batch[i], fmt.Errorf("no PubAck within %s", r.cfg.AckTimeout))
			}
			continue
		}
		select {
		case ack := <-f.Ok():
			ok(i, ack)
		case err := <-f.Err():
			fail(batch[i], err)
		case <-timeout.C:
			expired = true
			fail(batch[i], fmt.Errorf("no PubAck within %s", r.cfg.AckTimeout))
		case <-ctx.Done():
			expired = true
			fail(batch[i], ctx.Err())
		}
	}
	return acked, dups, failedIDs, failedErrs
}

// observe sets the pending and lag gauges from the table.
func (r *Relay) observe(ctx context.Context) {
	if ctx.Err() != nil || time.Since(r.observed) < observeEvery {
		return
	}
	r.observed = time.Now()
	var pending int64
	var lag float64
	err := r.cfg.Pool.QueryRow(ctx, `
		SELECT count(*), coalesce(extract(epoch FROM now() - min(created_at)), 0)::float8
		FROM outbox WHERE owner = $1`, r.cfg.Owner).Scan(&pending, &lag)
	if err != nil {
		r.log.Debug().Err(err).Msg("read outbox backlog")
		return
	}
	r.metrics.pending.WithLabelValues(r.cfg.Owner).Set(float64(pending))
	r.metrics.lag.WithLabelValues(r.cfg.Owner).Set(lag)
}
