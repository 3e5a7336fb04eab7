package faults_test

import (
	"context"
	"fmt"
	"sync"
	"testing"
	"time"

	"github.com/nats-io/nats.go/jetstream"

	"github.com/retryd/retryd/faults/harness"
	"github.com/retryd/retryd/internal/streams"
	"github.com/retryd/retryd/pkg/contract"
)

// clusterRun is what the cluster scenarios (13, 18, 19) share: a 3-node
// cluster of nats-server processes with R3 streams, the scheduler started
// with RETRYD_SCHEDULER_STREAM_REPLICAS=3, an owner of kind answering
// every due, and a steady load of first failures.
type clusterRun struct {
	t       *testing.T
	s       *harness.System
	c       *harness.NATSCluster
	r       *harness.Report
	owner   *harness.Owner
	pace    harness.Pace
	kind    string
	load    *steadyLoad
	started time.Time
}

// clusterLoad is the offered rate of first failures, per second, and how
// long the load runs at the least (it runs until the scenario's faults are
// over). The issue asks for at least 1,000 a second acknowledged: the full
// run offers 1,200, since a slice held through a failover is acknowledged
// late and the rate reached (first publish to last PubAck) comes out
// below the rate offered. The short run offers less, to stay well under a
// minute on 2 cores.
func clusterLoad() (rate int, span time.Duration) {
	return harness.Size(150, 1200), time.Duration(harness.Size(6, 20)) * time.Second
}

func newClusterRun(t *testing.T, scenario, prefix string, faultFor time.Duration) *clusterRun {
	t.Helper()
	const kind = "ft"
	cluster := harness.NewNATSCluster(t, t.Context(), 3)
	s := setup(t, harness.Options{NATSURL: cluster.URLs()})
	r := &harness.Report{Scenario: scenario}
	if err := streams.Ensure(s.Ctx, s.JS, streams.Options{Replicas: 3}); err != nil {
		t.Fatalf("create R3 streams: %v", err)
	}
	// A service started with default options (ingress and triggers ensure
	// the streams at start) must not scale the R3 streams down.
	if err := streams.Ensure(s.Ctx, s.JS, streams.Options{}); err != nil {
		t.Fatalf("ensure streams with default options: %v", err)
	}
	for _, name := range streams.Names {
		st, err := s.JS.Stream(s.Ctx, name)
		if err != nil {
			t.Fatalf("stream %s: %v", name, err)
		}
		if got := st.CachedInfo().Config.Replicas; got != 3 {
			t.Fatalf("stream %s has %d replicas after an Ensure with default options, want 3", name, got)
		}
	}
	if err := cluster.WaitCurrent(s.Ctx, streams.Names...); err != nil {
		t.Fatal(err)
	}
	s.Start(harness.Scheduler, "RETRYD_SCHEDULER_STREAM_REPLICAS=3")
	rate, span := clusterLoad()
	n := rate * int((span + faultFor).Seconds())
	// Pace measures an R1 stream on the cluster; RETRIES is R3, so every
	// message below is also replicated to two followers: the factor 2 of
	// assume is all the more a floor here.
	pace := s.Pace(r, assumeAll(r,
		requirement{"every retry resolved (failed, scheduled, due, succeeded)", msgsPerRetry * n, scenarioTimeout()},
	))
	s.Policy(kind, "", fastPolicy("faults-"+prefix, time.Second, 3))
	owner := s.NewOwner(kind, nil)
	owner.Start()
	cr := &clusterRun{t: t, s: s, c: cluster, r: r, owner: owner, pace: pace, kind: kind}
	cr.load = startSteadyLoad(t, s, kind, prefix, rate)
	cr.started = time.Now()
	return cr
}

// waitLoad waits until the load has run for a third of its span and the
// owner has received dues, so the fault lands in a running pipeline.
func (cr *clusterRun) waitLoad() {
	cr.t.Helper()
	_, span := clusterLoad()
	if _, ok := harness.Eventually(cr.s.Ctx, time.Minute, 20*time.Millisecond, func() bool {
		return time.Since(cr.started) >= span/3 && cr.owner.Count() > 0
	}); !ok {
		c, err := consumerInfo(cr.s.Ctx, cr.s.JS, contract.StreamRetries, "scheduler")
		cr.t.Fatalf("no dues before the fault: %d failures acknowledged, %d dues; scheduler consumer %s; %s",
			cr.load.Acked(), cr.owner.Count(), describe(c, err), cr.pace.Explain())
	}
	cr.r.Note("at the fault: %d failures acknowledged, %d dues received; client connections by node %v",
		cr.load.Acked(), cr.owner.Count(), cr.c.Clients(cr.s.Ctx))
}

// finish lets the load run until its span has passed and 2 s beyond the
// fault window [from, to], then waits for every acknowledged failure to
// come due and be answered, and checks and prints the figures: lost and
// duplicate effects (dueCheck), the rate reached, and the lateness of the
// dues whose due time fell inside the fault window against the rest.
func (cr *clusterRun) finish(from, to time.Time) {
	t, s, r := cr.t, cr.s, cr.r
	t.Helper()
	_, span := clusterLoad()
	time.Sleep(max(time.Until(cr.started.Add(span)), time.Until(to.Add(2*time.Second))))
	ids, err := cr.load.Stop()
	if err != nil {
		t.Fatalf("publish failures: %v", err)
	}
	inWindow, secs := cr.load.AckedBetween(from, to)
	r.Note("load: %d failures acknowledged in %s (%.0f/s, %d/s offered); %d of them in the %s fault window (%.0f/s)",
		len(ids), cr.load.Span().Round(time.Millisecond), float64(len(ids))/cr.load.Span().Seconds(), cr.load.rate,
		inWindow, to.Sub(from).Round(time.Millisecond), float64(inWindow)/secs)
	_, ok := harness.Eventually(s.Ctx, scenarioTimeout(), 50*time.Millisecond, func() bool {
		return cr.owner.Count() >= len(ids) && states(s.Ctx, s.Pool, cr.kind)["succeeded"] == len(ids)
	})
	r.Recover = time.Since(to)
	dueCheck(t, s, cr.owner, cr.kind, ids, r)
	var in, out []time.Duration
	for _, e := range cr.owner.Effects() {
		if e.Attempt != 2 {
			continue
		}
		late := e.FirstArrival.Sub(e.NextAttemptAt)
		if !e.NextAttemptAt.Before(from) && !e.NextAttemptAt.After(to) {
			in = append(in, late)
		} else {
			out = append(out, late)
		}
	}
	r.Note("due lateness (arrival at the owner - next_attempt_at): due inside the fault window (%d) p50 %s p99 %s max %s; outside it (%d) p50 %s p99 %s max %s",
		len(in), pct(in, 50), pct(in, 99), pct(in, 100), len(out), pct(out, 50), pct(out, 99), pct(out, 100))
	if panics := s.Panics(); len(panics) > 0 {
		t.Errorf("panics in %v", panics)
	}
	r.Print(t)
	if !ok || r.Lost != 0 || r.DuplicateEffects != 0 {
		t.Fatalf("lost %d, duplicate effects %d (resolved %v, rows %v)%s", r.Lost, r.DuplicateEffects, ok, states(s.Ctx, s.Pool, cr.kind), timedOut(ok, cr.pace))
	}
}

// steadyLoad publishes first failures at rate a second, in slices every
// 100 ms, each slice published (and republished until acknowledged) by a
// goroutine of its own: a broker that stalls delays the slices it holds,
// not the load offered after them, as with independent producers.
type steadyLoad struct {
	rate int

	mu     sync.Mutex
	ids    []string
	acks   []sliceAck
	first  time.Time
	err    error
	stop   chan struct{}
	wg     sync.WaitGroup
	loopWg sync.WaitGroup
}

type sliceAck struct {
	at time.Time
	n  int
}

func startSteadyLoad(t *testing.T, s *harness.System, kind, prefix string, rate int) *steadyLoad {
	t.Helper()
	// A producer waits 5 s for a PubAck, then publishes again (same
	// Nats-Msg-Id): a publish into a leaderless stream gets no answer, and
	// PublishAll's own 30 s wait would hold the slice far past the
	// failover.
	js, err := jetstream.New(s.NC, jetstream.WithPublishAsyncMaxPending(2048), jetstream.WithPublishAsyncTimeout(5*time.Second))
	if err != nil {
		t.Fatalf("jetstream: %v", err)
	}
	l := &steadyLoad{rate: rate, stop: make(chan struct{}), first: time.Now()}
	const tick = 100 * time.Millisecond
	per := max(1, rate/10)
	l.loopWg.Add(1)
	go func() {
		defer l.loopWg.Done()
		next := 0
		ticker := time.NewTicker(tick)
		defer ticker.Stop()
		for {
			ids := make([]string, per)
			msgs := make([]*natsMsg, per)
			for i := range per {
				ids[i] = fmt.Sprintf("%s-%07d", prefix, next)
				next++
				m, err := harness.FailedMsg(kind, ids[i], 1, "temporary", nil)
				if err != nil {
					l.fail(err)
					return
				}
				msgs[i] = m
			}
			l.wg.Add(1)
			go func() {
				defer l.wg.Done()
				if _, err := harness.PublishAll(s.Ctx, js, msgs); err != nil {
					l.fail(err)
					return
				}
				l.mu.Lock()
				l.ids = append(l.ids, ids...)
				l.acks = append(l.acks, sliceAck{time.Now(), len(ids)})
				l.mu.Unlock()
			}()
			select {
			case <-l.stop:
				return
			case <-s.Ctx.Done():
				return
			case <-ticker.C:
			}
		}
	}()
	return l
}

func (l *steadyLoad) fail(err error) {
	l.mu.Lock()
	defer l.mu.Unlock()
	if l.err == nil {
		l.err = err
	}
}

// Stop ends the load, waits for every slice to be acknowledged and
// returns the ids of the failures published.
func (l *steadyLoad) Stop() ([]string, error) {
	close(l.stop)
	l.loopWg.Wait()
	l.wg.Wait()
	l.mu.Lock()
	defer l.mu.Unlock()
	return l.ids, l.err
}

// Acked is how many failures were acknowledged so far.
func (l *steadyLoad) Acked() int {
	l.mu.Lock()
	defer l.mu.Unlock()
	return len(l.ids)
}

// Span is the time from the first publish to the last acknowledgement.
func (l *steadyLoad) Span() time.Duration {
	l.mu.Lock()
	defer l.mu.Unlock()
	last := l.first
	for _, a := range l.acks {
		if a.at.After(last) {
			last = a.at
		}
	}
	return last.Sub(l.first)
}

// AckedBetween is how many failures were acknowledged within [from, to],
// and its length in seconds.
func (l *steadyLoad) AckedBetween(from, to time.Time) (int, float64) {
	l.mu.Lock()
	defer l.mu.Unlock()
	n := 0
	for _, a := range l.acks {
		if !a.at.Before(from) && !a.at.After(to) {
			n += a.n
		}
	}
	return n, to.Sub(from).Seconds()
}

// waitCurrent waits, for at most limit, until every stream has a leader
// and current replicas on the other nodes.
func (cr *clusterRun) waitCurrent(limit time.Duration) time.Duration {
	cr.t.Helper()
	start := time.Now()
	ctx, cancel := context.WithTimeout(cr.s.Ctx, limit)
	defer cancel()
	if err := cr.c.WaitCurrent(ctx, streams.Names...); err != nil {
		cr.t.Fatalf("%v; %s", err, cr.pace.Explain())
	}
	return time.Since(start)
}

// leaderOf is the RETRIES leader as node via sees it, waiting until there
// is one other than not (not "" for any) for at most limit.
func (cr *clusterRun) leaderOf(via, not string, limit time.Duration) (string, time.Duration) {
	cr.t.Helper()
	start := time.Now()
	var leader string
	var last error
	_, ok := harness.Eventually(cr.s.Ctx, limit, 50*time.Millisecond, func() bool {
		leader, last = cr.c.StreamLeader(cr.s.Ctx, contract.StreamRetries, via)
		return last == nil && leader != "" && leader != not
	})
	if !ok {
		cr.t.Fatalf("RETRIES has no leader other than %q after %s (last error: %v)", not, limit, last)
	}
	return leader, time.Since(start)
}
