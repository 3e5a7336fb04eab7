// Package demo feeds a running retryd dev stack with realistic traffic: a
// throttled source and a source paused now and then (ingress holds), a
// trigger with a throttle and a max concurrency plus a small run executor
// (trigger-delivery retries), and a flaky worker (job retries, exhaustion
// and analytics). Fast policies (seconds, not hours) make retries show up
// within a minute.
package demo

import (
	"context"
	"crypto/tls"
	"errors"
	"fmt"
	"math/rand/v2"
	"sync"
	"time"

	"github.com/nats-io/nats.go/jetstream"
	"github.com/rs/zerolog"

	"github.com/retryd/retryd/internal/wait"
	"github.com/retryd/retryd/pkg/contract"
	"github.com/retryd/retryd/pkg/worker"
)

// Names the demo creates.
const (
	SourceShop     = "shop"
	SourcePartner  = "partner"
	TriggerID      = "demo-fulfil-order"
	Workflow       = "fulfil_order"
	ExecutorName   = "demo-run-executor"
	PublisherName  = "retryd/demo"
	partnerPause   = 15 * time.Second
	partnerCycle   = 60 * time.Second
	defaultTraffic = 1.0
)

// Config configures a Demo.
type Config struct {
	// API is the base URL of the stack's HTTP server.
	API string
	// Token is an admin token when the stack checks tokens (it sends
	// events and sets policies, sources and a trigger).
	Token string
	// JS publishes jobs and run outcomes.
	JS     jetstream.JetStream
	Logger zerolog.Logger
	// Traffic scales every producer's rate. Default 1 (about 3.3 events and
	// 2.5 jobs per second).
	Traffic float64
	// TLS is the client configuration for an https API; nil uses the
	// defaults.
	TLS *tls.Config
}

// Demo is the traffic generator.
type Demo struct {
	cfg      Config
	api      *client
	log      zerolog.Logger
	cancel   context.CancelFunc
	wg       sync.WaitGroup
	stopExec func()
	once     sync.Once
}

// New validates cfg.
func New(cfg Config) (*Demo, error) {
	if cfg.API == "" {
		return nil, errors.New("demo: Config.API is required")
	}
	if cfg.JS == nil {
		return nil, errors.New("demo: Config.JS is required")
	}
	if cfg.Traffic == 0 {
		cfg.Traffic = defaultTraffic
	}
	if cfg.Traffic < 0 || cfg.Traffic > 100 {
		return nil, fmt.Errorf("demo: Config.Traffic must be between 0 and 100, got %v", cfg.Traffic)
	}
	return &Demo{cfg: cfg, api: newClient(cfg.API, cfg.Token, cfg.TLS), log: cfg.Logger.With().Str("component", "demo").Logger()}, nil
}

// Start sets up the demo's policies, sources and trigger through the API,
// starts the run executor and the producers. ctx bounds the setup.
func (d *Demo) Start(ctx context.Context) error {
	if err := d.setup(ctx); err != nil {
		return fmt.Errorf("demo setup: %w", err)
	}
	if err := d.startExecutor(ctx); err != nil {
		return fmt.Errorf("demo run executor: %w", err)
	}
	runCtx, cancel := context.WithCancel(context.WithoutCancel(ctx))
	d.cancel = cancel
	d.every(runCtx, 700*time.Millisecond, d.shopEvent)
	d.every(runCtx, 10*time.Second, d.shopBurst)
	d.every(runCtx, time.Second, d.partnerEvent)
	d.every(runCtx, 400*time.Millisecond, d.job)
	d.wg.Go(func() { d.pauseCycle(runCtx) })
	d.log.Info().Float64("traffic", d.cfg.Traffic).Msg("demo traffic started")
	return nil
}

// Stop ends the producers and the executor. Runs in flight stay requested
// and are finished by the executor of the next start (its consumer is
// durable).
func (d *Demo) Stop(ctx context.Context) error {
	d.once.Do(func() {
		if d.cancel != nil {
			d.cancel()
		}
		if d.stopExec != nil {
			d.stopExec()
		}
	})
	if err := wait.Group(ctx, &d.wg); err != nil {
		return fmt.Errorf("stop demo: %w", err)
	}
	return nil
}

// every calls fn each period (scaled by Traffic) until ctx ends.
func (d *Demo) every(ctx context.Context, period time.Duration, fn func(ctx context.Context) error) {
	if d.cfg.Traffic <= 0 {
		return
	}
	period = time.Duration(float64(period) / d.cfg.Traffic)
	d.wg.Go(func() {
		tick(ctx, period, fn, func(err error) { d.log.Warn().Err(err).Msg("demo producer") })
	})
}

// tick calls fn each period until ctx ends; failed gets its errors, but
// for those of the end.
func tick(ctx context.Context, period time.Duration, fn func(ctx context.Context) error, failed func(error)) {
	t := time.NewTicker(period)
	defer t.Stop()
	for {
		select {
		case <-ctx.Done():
			return
		case <-t.C:
		}
		if err := fn(ctx); err != nil && ctx.Err() == nil {
			failed(err)
		}
	}
}

var customers = []string{"acme", "globex", "initech", "umbrella", "hooli", "stark", "wayne", "wonka"}

func (d *Demo) shopEvent(ctx context.Context) error {
	return d.postEvent(ctx, SourceShop, "order.created", map[string]any{
		"order_id": contract.NewID(), "customer": customers[rand.IntN(len(customers))],
		"total": float64(rand.IntN(30000)) / 100,
	})
}

// shopBurst sends more orders at once than the source's rate limit
// admits: the rest are deferred and come back as retries.
func (d *Demo) shopBurst(ctx context.Context) error {
	for range 6 + rand.IntN(6) {
		if err := d.shopEvent(ctx); err != nil {
			return err
		}
	}
	return nil
}

func (d *Demo) partnerEvent(ctx context.Context) error {
	return d.postEvent(ctx, SourcePartner, "invoice.paid", map[string]any{
		"invoice": fmt.Sprintf("INV-%05d", rand.IntN(100000)), "amount": rand.IntN(5000),
	})
}

func (d *Demo) postEvent(ctx context.Context, source, typ string, data any) error {
	return d.api.do(ctx, "POST", "/v1/events", map[string]any{"source": source, "type": typ, "data": data}, nil)
}

// demoPauseReason marks the demo's own pauses: only those are resumed by
// the demo.
const demoPauseReason = "demo: partner maintenance window"

// pauseCycle pauses the partner source, without an end, for partnerPause
// every partnerCycle, then resumes it: its events are held (not failed,
// whatever the retry budget) and the resume releases them at once. A
// source an operator paused is left alone: no demo pause over it, and no
// demo resume of it.
func (d *Demo) pauseCycle(ctx context.Context) {
	tick(ctx, partnerCycle, d.pauseOnce, func(err error) {
		d.log.Warn().Err(err).Str("source", SourcePartner).Msg("demo pause")
	})
}

// sourceState is what the demo reads of a source.
type sourceState struct {
	Paused      bool   `json:"paused"`
	PauseReason string `json:"pause_reason"`
}

func (d *Demo) pauseOnce(ctx context.Context) error {
	var src sourceState
	if err := d.api.do(ctx, "GET", "/v1/sources/"+SourcePartner, nil, &src); err != nil {
		return err
	}
	if src.Paused {
		return nil // an operator's pause: not the demo's to change
	}
	if err := d.api.do(ctx, "POST", "/v1/sources/"+SourcePartner+"/pause",
		map[string]any{"reason": demoPauseReason}, nil); err != nil {
		return err
	}
	select {
	case <-ctx.Done():
		return nil
	case <-time.After(partnerPause):
	}
	if err := d.api.do(ctx, "GET", "/v1/sources/"+SourcePartner, nil, &src); err != nil {
		return err
	}
	if !src.Paused || src.PauseReason != demoPauseReason {
		return nil // resumed, or paused again, by an operator meanwhile
	}
	return d.api.do(ctx, "POST", "/v1/sources/"+SourcePartner+"/resume", nil, nil)
}

func (d *Demo) job(ctx context.Context) error {
	var job contract.JobData
	switch roll := rand.Float64(); {
	case roll < 0.5:
		job = contract.JobData{JobType: JobSendEmail, TimeoutMS: 1200,
			Payload: mustJSON(emailPayload{To: customers[rand.IntN(len(customers))] + "@example.com", Template: "receipt"})}
	case roll < 0.8:
		job = contract.JobData{JobType: JobSyncCRM, Payload: mustJSON(map[string]string{"contact": contract.NewID()})}
	default:
		job = contract.JobData{JobType: JobChargeCard, Payload: mustJSON(map[string]any{"amount_cents": 500 + rand.IntN(20000)})}
	}
	_, err := worker.Enqueue(ctx, d.cfg.JS, job)
	return err
}
