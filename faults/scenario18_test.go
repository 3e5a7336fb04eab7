package faults_test

import (
	"context"
	"testing"
	"time"
)

// Scenario 18: a rolling restart of the three-node cluster under a steady
// load of failures: each nats-server is stopped (SIGTERM) and started
// again in turn, and the next only once every stream has a leader and
// current replicas on the other two nodes again, as an operator upgrading
// the cluster does. Every acknowledged failure comes due once.
func TestScenario18ClusterRollingRestart(t *testing.T) {
	// Not parallel: three nats-server processes at 1,200 failures a second
	// take the 2-core machine, and the scenarios with a time bound (16a's
	// 3 s to decide what a killed scheduler left) failed beside them (CI
	// run X). Serial tests run alone, before the parallel ones.
	cr := newClusterRun(t, "18 3-node cluster, rolling restart", "s18", 20*time.Second)
	cr.waitLoad()
	from := time.Now()
	for _, name := range cr.c.Names {
		node := cr.c.Node(name)
		down := time.Now()
		if err := node.Term(30 * time.Second); err != nil {
			t.Fatalf("stop %s: %v", name, err)
		}
		stopped := time.Since(down)
		ctx, cancel := context.WithTimeout(cr.s.Ctx, time.Minute)
		err := cr.c.StartNode(ctx, name)
		cancel()
		if err != nil {
			t.Fatal(err)
		}
		cr.r.Fault("restarted %s (SIGTERM, stopped in %s), %d failures acknowledged, %d dues received",
			name, stopped.Round(time.Millisecond), cr.load.Acked(), cr.owner.Count())
		caught := cr.waitCurrent(2 * time.Minute)
		cr.r.Note("%s: every stream led with all replicas current %s after it listened again (down %s in all)",
			name, caught.Round(time.Millisecond), time.Since(down).Round(time.Millisecond))
	}
	to := time.Now()
	cr.r.Note("rolling restart took %s", to.Sub(from).Round(time.Millisecond))
	cr.finish(from, to)
}
