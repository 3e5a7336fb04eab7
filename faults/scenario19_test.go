package faults_test

import (
	"testing"
	"time"

	"github.com/retryd/retryd/faults/harness"
)

// Scenario 19: the node leading RETRIES is cut off from the other two
// (every route to and from it closed and refused; the node keeps running
// and keeps its clients) for longer than an election takes, under a
// steady load of failures, then rejoined. The two others elect a leader
// and go on; what the cut-off node had not replicated was never
// acknowledged. Every acknowledged failure comes due once.
func TestScenario19ClusterPartition(t *testing.T) {
	t.Parallel()
	hold := time.Duration(harness.Size(8, 15)) * time.Second
	cr := newClusterRun(t, "19 3-node cluster, partition the stream leader", "s19", hold+10*time.Second)
	cr.waitLoad()
	victim, _ := cr.leaderOf("", "", 10*time.Second)
	var other string
	for _, n := range cr.c.Names {
		if n != victim && other == "" {
			other = n
		}
	}
	if err := cr.c.Partition(victim); err != nil {
		t.Fatal(err)
	}
	from := time.Now()
	cr.r.Fault("cut %s, leader of RETRIES (R3), off the other nodes (routes closed and refused) with %d failures acknowledged and %d dues received; the scheduler and the suite stay connected where they were",
		victim, cr.load.Acked(), cr.owner.Count())
	next, took := cr.leaderOf(other, victim, hold+time.Minute)
	cr.r.Note("the majority side (asked through %s) elected %s leader of RETRIES %s after the cut", other, next, took.Round(time.Millisecond))
	if _, ok := harness.Eventually(cr.s.Ctx, hold, 100*time.Millisecond, func() bool {
		return time.Since(from) >= hold
	}); !ok {
		t.Fatal("context ended during the partition")
	}
	if err := cr.c.Heal(victim); err != nil {
		t.Fatal(err)
	}
	cr.r.Fault("%s rejoined after %s, %d failures acknowledged, %d dues received", victim, time.Since(from).Round(time.Millisecond), cr.load.Acked(), cr.owner.Count())
	caught := cr.waitCurrent(2 * time.Minute)
	to := time.Now()
	cr.r.Note("every stream led with all replicas current %s after the rejoin; fault window %s", caught.Round(time.Millisecond), to.Sub(from).Round(time.Millisecond))
	cr.finish(from, to)
}
