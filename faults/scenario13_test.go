package faults_test

import (
	"context"
	"testing"
	"time"

	"github.com/retryd/retryd/pkg/contract"
)

// Scenario 13: a three-node JetStream cluster of nats-server processes
// with R3 streams; the leader of RETRIES is killed with kill -9 while
// failures are published (with acks) at a steady rate and the scheduler
// emits dues, and started again once another node leads: every
// acknowledged failure comes due once.
func TestScenario13ClusterLeaderStop(t *testing.T) {
	// Not parallel: three nats-server processes at 1,200 failures a second
	// take the 2-core machine, and the scenarios with a time bound (16a's
	// 3 s to decide what a killed scheduler left) failed beside them (CI
	// run X). Serial tests run alone, before the parallel ones.
	cr := newClusterRun(t, "13 3-node cluster, kill the stream leader", "s13", 10*time.Second)
	cr.waitLoad()
	leader, _ := cr.leaderOf("", "", 10*time.Second)
	node := cr.c.Node(leader)
	if err := node.Kill9(); err != nil {
		t.Fatal(err)
	}
	from := time.Now()
	cr.r.Fault("kill -9 of %s, leader of RETRIES (R3), with %d failures acknowledged and %d dues received", leader, cr.load.Acked(), cr.owner.Count())
	next, took := cr.leaderOf("", leader, time.Minute)
	cr.r.Note("new RETRIES leader %s %s after the kill", next, took.Round(time.Millisecond))
	ctx, cancel := context.WithTimeout(cr.s.Ctx, time.Minute)
	defer cancel()
	if err := cr.c.StartNode(ctx, leader); err != nil {
		t.Fatal(err)
	}
	cr.r.Fault("%s started again", leader)
	caught := cr.waitCurrent(2 * time.Minute)
	to := time.Now()
	cr.r.Note("every stream led with all replicas current %s after %s started again; fault window %s", caught.Round(time.Millisecond), leader, to.Sub(from).Round(time.Millisecond))
	if l, err := cr.c.StreamLeader(cr.s.Ctx, contract.StreamRetries, ""); err == nil {
		cr.r.Note("RETRIES leader at the end %s", l)
	}
	cr.finish(from, to)
}
