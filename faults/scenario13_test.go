package faults_test

import (
	"testing"
	"time"

	"github.com/retryd/retryd/faults/harness"
	"github.com/retryd/retryd/internal/streams"
	"github.com/retryd/retryd/pkg/contract"
)

// Scenario 13: a three-node JetStream cluster with R3 streams; the leader
// of RETRIES is stopped while failures are published (with acks) and the
// scheduler emits dues: every acknowledged failure comes due once.
func TestScenario13ClusterLeaderStop(t *testing.T) {
	t.Parallel()
	const kind = "ft"
	n := harness.Size(1500, 20_000)
	cluster := harness.NewCluster(t, 3, t.TempDir())
	s := setup(t, harness.Options{NATSURL: cluster.URLs()})
	r := &harness.Report{Scenario: "13 3-node cluster, stop the stream leader"}
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
	s.Start(harness.Scheduler, "RETRYD_SCHEDULER_STREAM_REPLICAS=3")
	// Pace measures an R1 stream on the cluster; RETRIES is R3, so every
	// message below is also replicated to two followers: the factor 2 of
	// assume is all the more a floor here.
	pace := s.Pace(r, assumeAll(r,
		requirement{"a third of the failures applied before the fault", n / 3, time.Minute},
		requirement{"every retry resolved (failed, scheduled, due, succeeded)", msgsPerRetry * n, scenarioTimeout()},
	))
	s.Policy(kind, "", fastPolicy("faults-13", time.Second, 3))
	owner := s.NewOwner(kind, nil)
	owner.Start()

	ids, msgs := failedItems(t, kind, "s13", n, nil)
	loadStart := time.Now()
	pubDone := make(chan error, 1)
	go func() {
		for i := 0; i < len(msgs); i += 50 {
			time.Sleep(4 * time.Second / time.Duration(len(msgs)/50))
			if _, err := harness.PublishAll(s.Ctx, s.JS, msgs[i:min(i+50, len(msgs))]); err != nil {
				pubDone <- err
				return
			}
		}
		pubDone <- nil
	}()
	if _, ok := harness.Eventually(s.Ctx, time.Minute, 10*time.Millisecond, func() bool {
		return sum(states(s.Ctx, s.Pool, kind)) >= n/3
	}); !ok {
		si, err := s.JS.Stream(s.Ctx, contract.StreamRetries)
		var state any = err
		if err == nil {
			state = si.CachedInfo().State
		}
		c, cerr := consumerInfo(s.Ctx, s.JS, contract.StreamRetries, "scheduler")
		t.Fatalf("no load before the fault: RETRIES %+v; consumer %s; %s", state, describe(c, cerr), pace.Explain())
	}
	r.Note("a third of the failures applied %s after the first publish", time.Since(loadStart).Round(time.Millisecond))
	stream, err := s.JS.Stream(s.Ctx, contract.StreamRetries)
	if err != nil {
		t.Fatal(err)
	}
	info, err := stream.Info(s.Ctx)
	if err != nil || info.Cluster == nil || info.Cluster.Leader == "" {
		t.Fatalf("RETRIES has no leader: %v %+v", err, info)
	}
	leader := cluster.ByName(info.Cluster.Leader)
	leader.Shutdown()
	stopped := time.Now()
	r.Fault("shut down %s, leader of RETRIES (R%d), with %d dues received", info.Cluster.Leader, info.Config.Replicas, owner.Count())
	if err := <-pubDone; err != nil {
		t.Fatalf("publish: %v", err)
	}
	_, ok := harness.Eventually(s.Ctx, scenarioTimeout(), 50*time.Millisecond, func() bool {
		return owner.Count() >= n && states(s.Ctx, s.Pool, kind)["succeeded"] == n
	})
	r.Recover = time.Since(stopped)
	if info, err := stream.Info(s.Ctx); err == nil && info.Cluster != nil {
		r.Note("new RETRIES leader %s", info.Cluster.Leader)
	}
	dueCheck(t, s, owner, kind, ids, r)
	r.Print(t)
	if !ok || r.Lost != 0 || r.DuplicateEffects != 0 {
		t.Fatalf("lost %d, duplicate effects %d (resolved %v, rows %v)%s", r.Lost, r.DuplicateEffects, ok, states(s.Ctx, s.Pool, kind), timedOut(ok, pace))
	}
}
