package main

import (
	"context"
	"fmt"
	"os"
	"strconv"
	"strings"
	"sync/atomic"
	"time"

	"github.com/jackc/pgx/v5/pgxpool"
	"github.com/nats-io/nats.go"
	"github.com/nats-io/nats.go/jetstream"
	"github.com/prometheus/client_golang/prometheus"
	"github.com/rs/zerolog"

	"github.com/retryd/retryd/internal/streams"
	"github.com/retryd/retryd/migrations"
	"github.com/retryd/retryd/pkg/contract"
	"github.com/retryd/retryd/services/scheduler"
)

const benchPolicies = `
INSERT INTO retry_policies (kind, job_type, name, max_retries, base_delay_ms, multiplier, max_delay_ms, jitter, jitter_ms, updated_by) VALUES
    ('bench', '', 'bench-cycle-100ms', 3, 100,  1, 100,  'none', 0, 'bench'),
    ('probe', '', 'bench-probe-1s',    3, 1000, 1, 1000, 'none', 0, 'bench'),
    ('bg',    '', 'bench-background',  3, 1000, 1, 1000, 'none', 0, 'bench'),
    ('burst', '', 'bench-burst',       3, 1000, 1, 1000, 'none', 0, 'bench')
ON CONFLICT (kind, job_type) DO NOTHING`

// retrydDB is a migrated database with the bench policies.
type retrydDB struct {
	pg   *pgServer
	name string
	url  string
	pool *pgxpool.Pool
}

func newRetrydDB(ctx context.Context, pg *pgServer) (*retrydDB, error) {
	d := &retrydDB{pg: pg, name: dbName("retryd")}
	var err error
	if d.url, err = pg.createDB(ctx, d.name); err != nil {
		return nil, err
	}
	if err := migrations.Up(ctx, d.url, zerolog.Nop()); err != nil {
		return nil, fmt.Errorf("migrate retryd database: %w", err)
	}
	if d.pool, err = newPool(ctx, d.url, 20); err != nil {
		return nil, err
	}
	if _, err := d.pool.Exec(ctx, benchPolicies); err != nil {
		d.close(ctx)
		return nil, fmt.Errorf("insert bench policies: %w", err)
	}
	return d, nil
}

func (d *retrydDB) close(ctx context.Context) {
	if d.pool != nil {
		d.pool.Close()
	}
	d.pg.dropDB(context.WithoutCancel(ctx), d.name)
}

// retrydSys is retryd as the bench runs it in process: the scheduler
// library on its own pool and NATS connection, and owners on theirs.
type retrydSys struct {
	env   Env
	ns    *natsServer
	db    *retrydDB
	sched *scheduler.Scheduler
	schNC *nats.Conn
	owner *nats.Conn
	ojs   jetstream.JetStream
	pub   *asyncPublisher
	// logged counts the in-process scheduler's warnings and errors.
	logged logCount
	// onMeter, when set, gets each cycle run's meter before it starts
	// (the shards scenario reads the machine's CPU as the window opens).
	onMeter func(*cycleMeter)
}

// startRetryd starts NATS, the database and, unless noScheduler, the
// in-process scheduler. (Recovery and memory run the scheduler binary
// instead.)
func startRetryd(ctx context.Context, env Env, noScheduler bool) (_ *retrydSys, err error) {
	r := &retrydSys{env: env}
	defer func() {
		if err != nil {
			r.close(ctx)
		}
	}()
	if r.ns, err = startNATS(env.NATSSync); err != nil {
		return nil, err
	}
	if err := streams.Ensure(ctx, r.ns.js, streams.Options{}); err != nil {
		return nil, fmt.Errorf("ensure streams: %w", err)
	}
	if r.db, err = newRetrydDB(ctx, env.pg); err != nil {
		return nil, err
	}
	if r.owner, r.ojs, err = r.ns.connect("bench-owner"); err != nil {
		return nil, err
	}
	r.pub = newAsyncPublisher(r.ojs)
	if !noScheduler {
		if err := r.startScheduler(ctx); err != nil {
			return nil, err
		}
	}
	return r, nil
}

func (r *retrydSys) startScheduler(ctx context.Context) (err error) {
	// Its connection's goroutines and its loops carry the label.
	labelled(ctx, compScheduler, func(ctx context.Context) { err = r.startSchedulerLabelled(ctx) })
	return err
}

func (r *retrydSys) startSchedulerLabelled(ctx context.Context) error {
	nc, js, err := r.ns.connect("retryd-scheduler")
	if err != nil {
		return err
	}
	r.schNC = nc
	s, err := scheduler.New(schedulerConfig(r.db.pool, js, r.logged.logger()))
	if err != nil {
		return fmt.Errorf("new scheduler: %w", err)
	}
	if err := s.Start(ctx); err != nil {
		return fmt.Errorf("start scheduler: %w", err)
	}
	r.sched = s
	return nil
}

// envInt reads one of the retryd-scheduler binary's tuning variables, so
// the in-process scheduler and the child process are tuned alike (the
// child inherits the environment); 0 (unset) means the default.
func envInt(name string) int {
	n, _ := strconv.Atoi(os.Getenv(name))
	return max(n, 0)
}

func (r *retrydSys) close(ctx context.Context) {
	if r.sched != nil {
		stopCtx, cancel := context.WithTimeout(context.WithoutCancel(ctx), 30*time.Second)
		_ = r.sched.Stop(stopCtx)
		cancel()
		fmt.Fprintf(r.env.Out, "retryd scheduler (in process): %s\n", &r.logged)
	}
	if r.pub != nil {
		r.pub.close()
	}
	if r.schNC != nil {
		r.schNC.Close()
	}
	if r.owner != nil {
		r.owner.Close()
	}
	if r.db != nil {
		r.db.close(ctx)
	}
	if r.ns != nil {
		r.ns.close()
	}
}

func (r *retrydSys) durability(ctx context.Context) string {
	return "Postgres " + durability(ctx, r.db.pool) + "; NATS " + r.env.NATSSync.String()
}

// Item ids carry the time the owner reported the failure, so the owner
// can tell the end-to-end time from the due event alone.
func itemID(prefix string, at time.Time, seq int64) string {
	return prefix + "-" + strconv.FormatInt(at.UnixNano(), 36) + "-" + strconv.FormatInt(seq, 36)
}

func itemTime(id string) time.Time {
	parts := strings.Split(id, "-")
	if len(parts) != 3 {
		return time.Time{}
	}
	n, err := strconv.ParseInt(parts[1], 36, 64)
	if err != nil {
		return time.Time{}
	}
	return time.Unix(0, n)
}

// publishFailed reports attempt 1 of a new item as failed with a
// retryable error, as an owner would.
func (r *retrydSys) publishFailed(ctx context.Context, kind, id string, cb func(error)) error {
	msg, err := contract.NewLifecycleMsg("bench/owner", contract.Failed, &contract.FailedData{
		Kind: kind, ID: id, Attempt: 1,
		Error: contract.ErrorInfo{Class: "temporary", Message: "upstream unavailable"},
	}, time.Now())
	if err != nil {
		return err
	}
	return r.pub.publish(ctx, msg, cb)
}

func (r *retrydSys) publishSucceeded(ctx context.Context, kind, id string, attempt int, cb func(error)) error {
	msg, err := contract.NewLifecycleMsg("bench/owner", contract.Succeeded, &contract.SucceededData{
		Kind: kind, ID: id, Attempt: attempt,
	}, time.Now())
	if err != nil {
		return err
	}
	return r.pub.publish(ctx, msg, cb)
}

// dueEvent is a due event as the owner received it.
type dueEvent struct {
	data       *contract.DueData
	receivedAt time.Time
	storedAt   time.Time
	streamSeq  uint64
	redelivery bool
}

// ownDue consumes the due events of kind as its owner would (durable
// consumer, explicit acks) and passes each to handle.
func (r *retrydSys) ownDue(ctx context.Context, kind string, handle func(dueEvent)) (stop func(), err error) {
	return consume(ctx, r.ojs, contract.StreamRetries, jetstream.ConsumerConfig{
		Durable: "bench-owner-" + kind, FilterSubject: contract.RetryFilter(kind, contract.Due),
		MaxAckPending: 50_000, DeliverPolicy: jetstream.DeliverAllPolicy,
	}, func(m jetstream.Msg) {
		now := time.Now()
		ev, err := contract.DecodeLifecycle(m.Subject(), m.Data())
		if err != nil || ev.Due == nil {
			_ = m.TermWithReason("bench: not a due event")
			return
		}
		md, _ := m.Metadata()
		_ = m.Ack()
		de := dueEvent{data: ev.Due, receivedAt: now}
		if md != nil {
			de.streamSeq, de.redelivery, de.storedAt = md.Sequence.Stream, md.NumDelivered > 1, md.Timestamp
		}
		handle(de)
	})
}

// retrydCycles runs the cycle workload: the owner reports attempt 1
// failed, the scheduler schedules it 100 ms ahead and emits due, the owner
// reports attempt 2 succeeded; the PubAck of that report completes the
// cycle and starts a new item.
func retrydCycles(ctx context.Context, env Env, window int, warmup, dur time.Duration) (cycleResult, error) {
	r, err := startRetryd(ctx, env, false)
	if err != nil {
		return cycleResult{}, err
	}
	defer r.close(ctx)
	return r.cycles(ctx, window, warmup, dur)
}

func (r *retrydSys) cycles(ctx context.Context, window int, warmup, dur time.Duration) (cycleResult, error) {
	runCtx, cancel := context.WithCancel(ctx)
	defer cancel()
	meter := newCycleMeter(window, warmup, dur)
	finishCost, abortCost := measureCost(ctx, r.env, meter, r.db.name, r.ns, "retryd")
	defer abortCost()
	if r.onMeter != nil {
		r.onMeter(meter)
	}
	// Items are started from this goroutine and from the replenisher.
	var seq atomic.Int64
	errc := make(chan error, 1)
	fail := func(err error) { reportFirst(runCtx, errc, err) }
	replenish := make(chan struct{}, 4*window)
	stop, err := r.ownDue(ctx, kindCycle, func(ev dueEvent) {
		id := ev.data.ID
		err := r.publishSucceeded(runCtx, kindCycle, id, ev.data.Attempt, func(err error) {
			if err != nil {
				fail(err)
				return
			}
			meter.done(itemTime(id))
			replenish <- struct{}{}
		})
		if err != nil {
			fail(err)
		}
	})
	if err != nil {
		return cycleResult{}, err
	}
	defer stop()
	newItem := func() error {
		return r.publishFailed(runCtx, kindCycle, itemID("c", time.Now(), seq.Add(1)), nil)
	}
	if err := meter.drive(runCtx, window, replenish, errc, newItem); err != nil {
		return cycleResult{}, err
	}
	res := meter.result()
	finishCost(&res)
	res.durability = r.durability(ctx)
	return res, nil
}

// settle waits until the scheduler has applied every lifecycle message
// and emitted every row already due, so what one measurement left in
// flight (a cycle run stops with its window of items mid-way) does not
// load the next one. It gives up after limit.
func (r *retrydSys) settle(ctx context.Context, limit time.Duration) (time.Duration, error) {
	start := time.Now()
	cons, err := r.ns.js.Consumer(ctx, contract.StreamRetries, scheduler.ConsumerName)
	if err != nil {
		return 0, fmt.Errorf("look up scheduler consumer: %w", err)
	}
	waitFor(ctx, limit, func() bool {
		info, err := cons.Info(ctx)
		if err != nil || info.NumPending > 0 || info.NumAckPending > 0 {
			return false
		}
		var late int64
		err = r.db.pool.QueryRow(ctx, "SELECT count(*) FROM retries WHERE state = 'scheduled' AND next_attempt_at < now()").Scan(&late)
		return err == nil && late == 0
	})
	return time.Since(start), nil
}

// probe runs the lateness probe through the real failed path: the owner
// reports probe items failed at spec.rate, the scheduler schedules them
// 1 s ahead, and lateness is from next_attempt_at (in the due event) to
// the owner receiving it. The owner then reports success, as it would.
func (r *retrydSys) probe(ctx context.Context, spec probeSpec) (latenessResult, error) {
	return r.probeObserved(ctx, spec, nil)
}

// probeObserved is probe that also passes each counted item to observe
// (nil: none).
func (r *retrydSys) probeObserved(ctx context.Context, spec probeSpec, observe func(dueSample)) (latenessResult, error) {
	rec := newProbeRecorder(spec)
	rec.observe = observe
	stop, err := r.ownDue(ctx, kindProbe, func(ev dueEvent) {
		rec.due(itemTime(ev.data.ID), ev.data.NextAttemptAt, ev.receivedAt)
		_ = r.publishSucceeded(ctx, kindProbe, ev.data.ID, ev.data.Attempt, nil)
	})
	if err != nil {
		return latenessResult{}, err
	}
	defer stop()
	var seq int64
	err = rec.run(ctx, 2*spec.delay+15*time.Second, func(n int) error {
		for range n {
			seq++
			if err := r.publishFailed(ctx, kindProbe, itemID("p", time.Now(), seq), nil); err != nil {
				return err
			}
		}
		return nil
	})
	if err != nil {
		return latenessResult{}, err
	}
	res := rec.result()
	res.durability = r.durability(ctx)
	return res, nil
}

// ownBackground acks background due events and reports them succeeded,
// so background rows load the scheduler as real owners would.
func (r *retrydSys) ownBackground(ctx context.Context, kind string) (stop func(), err error) {
	return r.ownDue(ctx, kind, func(ev dueEvent) {
		_ = r.publishSucceeded(ctx, kind, ev.data.ID, ev.data.Attempt, nil)
	})
}

// background loads n pending rows of kindBG spread over the next hour
// (COPY) and starts their owner; stop ends the owner.
func (r *retrydSys) background(ctx context.Context, n int) (stop func(), err error) {
	if err := copyPending(ctx, r.db.pool, pendingRows{kind: kindBG, n: n, from: backgroundStart(n), span: time.Hour}); err != nil {
		return nil, err
	}
	return r.ownBackground(ctx, kindBG)
}

// retrydLateness: P background rows spread over the next hour (COPY),
// their owner, and the probe.
func retrydLateness(ctx context.Context, env Env, pending int, spec probeSpec) (latenessResult, error) {
	r, err := startRetryd(ctx, env, false)
	if err != nil {
		return latenessResult{}, err
	}
	defer r.close(ctx)
	loadStart := time.Now()
	stopBG, err := r.background(ctx, pending)
	if err != nil {
		return latenessResult{}, err
	}
	loaded := time.Since(loadStart)
	defer stopBG()
	res, err := r.probe(ctx, spec)
	if err != nil {
		return latenessResult{}, err
	}
	res.loadTime = loaded
	res.loadHow = "COPY into retries (state scheduled)"
	return res, nil
}

// retrydBurst: n rows due within one second, loaded with COPY while the
// scheduler runs; the owner acks the due events.
func retrydBurst(ctx context.Context, env Env, n int) (burstResult, error) {
	r, err := startRetryd(ctx, env, false)
	if err != nil {
		return burstResult{}, err
	}
	defer r.close(ctx)
	return r.burst(ctx, n, true)
}

// burst loads n items due within one second and waits for the owner to
// receive them all; withCost reads the burst's CPU (the scheduler in
// process: its CPU is the bench process's).
func (r *retrydSys) burst(ctx context.Context, n int, withCost bool) (burstResult, error) {
	var err error
	br := newBurstRecorder(n)
	var stop func()
	labelled(ctx, compOwner, func(ctx context.Context) {
		stop, err = r.ownDue(ctx, kindBurst, func(ev dueEvent) {
			br.received1(ev.data.NextAttemptAt, ev.receivedAt)
			br.stored1(ev.storedAt)
		})
	})
	if err != nil {
		return burstResult{}, err
	}
	defer stop()
	t0, _ := br.startLoad(20_000)
	if err := copyPending(ctx, r.db.pool, pendingRows{kind: kindBurst, n: n, from: t0, span: time.Second}); err != nil {
		return burstResult{}, err
	}
	endCost, abortCost := func() *burstCost { return nil }, func() {}
	if withCost {
		endCost, abortCost = probeBurst(ctx, r.env, r, t0, n)
	}
	defer abortCost()
	res, err := br.loaded(ctx)
	if err != nil {
		return burstResult{}, err
	}
	res.cost = endCost()
	res.durability = r.durability(ctx)
	return res, nil
}

// schedulerConfig is the configuration of every scheduler the bench
// runs: the defaults, but for the tuning variables a run may set.
func schedulerConfig(pool *pgxpool.Pool, js jetstream.JetStream, log zerolog.Logger) scheduler.Config {
	return scheduler.Config{
		Pool: pool, JS: js, Logger: log, Registerer: prometheus.NewRegistry(),
		BatchSize:     envInt("RETRYD_SCHEDULER_BATCH_SIZE"),
		ConsumeBatch:  envInt("RETRYD_SCHEDULER_CONSUME_BATCH"),
		MaxAckPending: envInt("RETRYD_SCHEDULER_MAX_ACK_PENDING"),
		Emitters:      envInt("RETRYD_SCHEDULER_EMITTERS"),
	}
}
