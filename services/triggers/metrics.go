package triggers

import (
	"context"
	"time"

	"github.com/jackc/pgx/v5/pgxpool"
	"github.com/prometheus/client_golang/prometheus"
	"github.com/rs/zerolog"
)

// metrics are the service's counters, labelled by trigger id (triggers are
// defined by operators, so the label set stays small).
type metrics struct {
	launched           *prometheus.CounterVec
	filtered           *prometheus.CounterVec
	throttled          *prometheus.CounterVec
	throttleWaits      *prometheus.CounterVec
	concurrencyLimited *prometheus.CounterVec
	retried            *prometheus.CounterVec
	retrySucceeded     *prometheus.CounterVec
	exhausted          *prometheus.CounterVec
	cancelled          *prometheus.CounterVec
	runsFinished       *prometheus.CounterVec
	runsFailed         *prometheus.CounterVec
	runsRetried        *prometheus.CounterVec
	steps              *prometheus.CounterVec
	heartbeats         *prometheus.CounterVec
	malformed          *prometheus.CounterVec
	duplicates         *prometheus.CounterVec
	errors             *prometheus.CounterVec
	reconciled         prometheus.Counter
}

func newMetrics(reg prometheus.Registerer) (*metrics, error) {
	counter := func(name, help string, labels ...string) *prometheus.CounterVec {
		return prometheus.NewCounterVec(prometheus.CounterOpts{Namespace: "retryd", Subsystem: "triggers", Name: name, Help: help}, labels)
	}
	m := &metrics{
		launched:           counter("launched_total", "Deliveries that launched a run (first attempt or retry).", "trigger_id"),
		filtered:           counter("filtered_total", "Deliveries the predicate filtered out, by reason (predicate_false, predicate_error, throttle_key_error).", "trigger_id", "reason"),
		throttled:          counter("throttled_total", "Delivery attempts held back by the trigger's throttle and queued for a retry.", "trigger_id"),
		throttleWaits:      counter("throttle_waits_total", "Due events of throttled deliveries handed back to wait a moment in place, at the head of the line, for the window's room (not a new hold).", "trigger_id"),
		concurrencyLimited: counter("concurrency_limited_total", "Delivery attempts held back by max concurrency and queued for a retry.", "trigger_id"),
		retried:            counter("retried_total", "Retry attempts of held deliveries (due events handled).", "trigger_id"),
		retrySucceeded:     counter("retry_succeeded_total", "Held deliveries that launched on a retry.", "trigger_id"),
		exhausted:          counter("exhausted_total", "Held deliveries the scheduler gave up on.", "trigger_id"),
		cancelled:          counter("cancelled_total", "Held deliveries cancelled, by reason.", "trigger_id", "reason"),
		runsFinished:       counter("runs_finished_total", "Runs that ended (completed, failed or failed_max_retries), freeing a concurrency slot.", "trigger_id", "status"),
		runsFailed:         counter("runs_failed_total", "Failed run attempts reported to the scheduler, by error class (run_timeout attempts are class timeout).", "trigger_id", "class"),
		runsRetried:        counter("runs_retried_total", "Runs launched again from their checkpoint (retry.run.due handled).", "trigger_id"),
		steps:              counter("run_steps_total", "Run nodes reported by executors and recorded, by status.", "status"),
		heartbeats:         counter("heartbeats_total", "Run heartbeats by result: extended (a run in flight kept its slot) or ignored (the run finished, or retryd did not launch it).", "result"),
		malformed:          counter("malformed_total", "Messages terminated because they cannot be decoded or validated.", "consumer"),
		duplicates:         counter("duplicates_total", "Messages already applied (redeliveries, replays).", "consumer"),
		errors:             counter("errors_total", "Messages whose handling failed and that will be redelivered.", "consumer"),
		reconciled: prometheus.NewCounter(prometheus.CounterOpts{Namespace: "retryd", Subsystem: "triggers", Name: "reconciled_total",
			Help: "Failed events published again for held deliveries the scheduler never confirmed."}),
	}
	for _, c := range []prometheus.Collector{m.launched, m.filtered, m.throttled, m.throttleWaits, m.concurrencyLimited, m.retried,
		m.retrySucceeded, m.exhausted, m.cancelled, m.runsFinished, m.runsFailed, m.runsRetried, m.steps, m.heartbeats, m.malformed, m.duplicates, m.errors, m.reconciled} {
		if err := reg.Register(c); err != nil {
			return nil, err
		}
	}
	return m, nil
}

// heldCollector reports the deliveries waiting for a retry per trigger and
// status ("throttled queued"), read from Postgres at scrape time so every
// instance reports the same truth and no process keeps per-delivery state.
type heldCollector struct {
	pool *pgxpool.Pool
	log  zerolog.Logger
	desc *prometheus.Desc
}

func newHeldCollector(pool *pgxpool.Pool, log zerolog.Logger) *heldCollector {
	return &heldCollector{pool: pool, log: log, desc: prometheus.NewDesc(
		"retryd_triggers_held_deliveries",
		"Deliveries currently held back and waiting for a retry, by trigger and status (throttled, concurrency_limited).",
		[]string{"trigger_id", "status"}, nil)}
}

func (c *heldCollector) Describe(ch chan<- *prometheus.Desc) { ch <- c.desc }

func (c *heldCollector) Collect(ch chan<- prometheus.Metric) {
	ctx, cancel := context.WithTimeout(context.Background(), 2*time.Second)
	defer cancel()
	rows, err := c.pool.Query(ctx, `
		SELECT trigger_id, status, count(*) FROM workflow_trigger_deliveries
		WHERE retry_state = 'scheduled' AND status IN ('throttled', 'concurrency_limited')
		GROUP BY trigger_id, status`)
	if err != nil {
		c.log.Warn().Err(err).Msg("collect held deliveries")
		return
	}
	defer rows.Close()
	for rows.Next() {
		var trigger, status string
		var n int64
		if err := rows.Scan(&trigger, &status, &n); err != nil {
			c.log.Warn().Err(err).Msg("collect held deliveries")
			return
		}
		ch <- prometheus.MustNewConstMetric(c.desc, prometheus.GaugeValue, float64(n), trigger, status)
	}
}
