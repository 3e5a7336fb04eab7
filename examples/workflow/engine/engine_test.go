package engine_test

import (
	"encoding/json"
	"testing"
	"time"

	"github.com/stretchr/testify/require"

	"github.com/retryd/retryd/examples/workflow/engine"
	"github.com/retryd/retryd/pkg/contract"
)

// Three attempts as triggers would request them: enrich fails twice
// with class network, each failure is a failed step and a failed run
// echoing the attempt; the retries resume after fetch with its output,
// and the third attempt completes.
func TestFailedAttemptsThenResumeCompletes(t *testing.T) {
	t.Parallel()
	b := setup(t)
	b.start(t, engine.Config{})
	const run = "run-retry"

	b.request(t, newRequest(run, 0, nil))
	ends := b.waitEnds(t, run, 1)
	require.Equal(t, contract.RunFailed, ends[0].event)
	require.Equal(t, contract.RunFinishedData{RunID: run, Workflow: workflow, Attempt: 1, Node: engine.NodeEnrich, Executor: "engine-1",
		Error: ends[0].data.Error}, ends[0].data)
	require.Equal(t, "network", ends[0].data.Error.Class)
	require.Equal(t, "run-failed:"+run, ends[0].msgID)
	steps := b.steps(t, run)
	require.Equal(t, []string{"fetch/completed", "enrich/failed/network"}, summaries(steps, 1))
	fetched := steps[0].Output
	require.JSONEq(t, `{"record":"rec-`+run+`","event":{"order":42}}`, string(fetched))
	require.Equal(t, "run-step:"+run+":1:fetch", contract.RunStepMsgID(run, steps[0].Attempt, steps[0].Node))

	resume := &contract.RunCheckpoint{Node: engine.NodeFetch, Outputs: map[string]json.RawMessage{engine.NodeFetch: fetched}}
	b.request(t, newRequest(run, 2, resume))
	ends = b.waitEnds(t, run, 2)
	require.Equal(t, contract.RunFailed, ends[1].event)
	require.Equal(t, 2, ends[1].data.Attempt)
	require.Equal(t, "run-failed:"+run+":2", ends[1].msgID)
	require.Equal(t, []string{"enrich/failed/network"}, summaries(b.steps(t, run), 2))

	b.request(t, newRequest(run, 3, resume))
	ends = b.waitEnds(t, run, 3)
	require.Equal(t, contract.RunCompleted, ends[2].event)
	require.Equal(t, contract.RunFinishedData{RunID: run, Workflow: workflow, Attempt: 3, Executor: "engine-1"}, ends[2].data)
	require.Equal(t, "run-completed:"+run+":3", ends[2].msgID)
	steps = b.steps(t, run)
	require.Equal(t, []string{"enrich/completed", "notify/completed"}, summaries(steps, 3))

	require.Len(t, b.record.Executions(t, run, engine.NodeFetch), 1)
	enrich := b.record.Executions(t, run, engine.NodeEnrich)
	require.Len(t, enrich, 3)
	for i, x := range enrich {
		require.Equal(t, i+1, x.Execution)
		require.Equal(t, i+1, x.Attempt)
		require.JSONEq(t, string(fetched), string(x.Input), "enrich gets fetch's output")
	}
	notify := b.record.Executions(t, run, engine.NodeNotify)
	require.Len(t, notify, 1)
	require.JSONEq(t, string(steps[len(steps)-2].Output), string(notify[0].Input), "notify gets enrich's output")
	for _, n := range engine.NodeNames() {
		require.Equal(t, 1, b.record.Effects(t, run, n), "effect of %s", n)
	}
	b.settled(t)
}

// resume_from skips every node up to and including its node and feeds
// that node's output to the next.
func TestResumeFromSkipsCompletedNodes(t *testing.T) {
	t.Parallel()
	b := setup(t)
	eng, _ := b.start(t, engine.Config{FailFirst: -1})
	const run = "run-resume"
	enriched := json.RawMessage(`{"tier":"silver","from":"an earlier attempt"}`)
	b.request(t, newRequest(run, 4, &contract.RunCheckpoint{Node: engine.NodeEnrich, Outputs: map[string]json.RawMessage{
		engine.NodeFetch: json.RawMessage(`{"record":"r"}`), engine.NodeEnrich: enriched,
	}}))
	ends := b.waitEnds(t, run, 1)
	require.Equal(t, contract.RunCompleted, ends[0].event)
	require.Equal(t, 4, ends[0].data.Attempt)
	require.Equal(t, []string{"notify/completed"}, summaries(b.steps(t, run), 4))
	require.Empty(t, b.record.Executions(t, run, engine.NodeFetch))
	require.Empty(t, b.record.Executions(t, run, engine.NodeEnrich))
	notify := b.record.Executions(t, run, engine.NodeNotify)
	require.Len(t, notify, 1)
	require.JSONEq(t, string(enriched), string(notify[0].Input))
	require.Equal(t, engine.Stats{Completed: 1}, eng.Stats())
}

// A checkpoint naming a node the workflow lacks cannot resume: the run
// fails, non-retryable, without running anything.
func TestResumeFromUnknownNodeFails(t *testing.T) {
	t.Parallel()
	b := setup(t)
	b.start(t, engine.Config{})
	const run = "run-bad-resume"
	b.request(t, newRequest(run, 2, &contract.RunCheckpoint{Node: "gone", Outputs: map[string]json.RawMessage{"gone": json.RawMessage(`1`)}}))
	ends := b.waitEnds(t, run, 1)
	require.Equal(t, contract.RunFailed, ends[0].event)
	require.Equal(t, "validation", ends[0].data.Error.Class)
	require.True(t, ends[0].data.Error.NonRetryable)
	require.Empty(t, b.steps(t, run))
}

// Requests that do not decode are terminated and counted; the engine
// goes on with the next request.
func TestMalformedRequestsAreTerminated(t *testing.T) {
	t.Parallel()
	b := setup(t)
	eng, _ := b.start(t, engine.Config{FailFirst: -1})
	b.publishRaw(t, "runs."+workflow+".requested.junk", []byte("not json"))
	mismatched, err := contract.NewRunMsg("test/triggers", contract.RunRequested, newRequest("run-a", 1, nil), time.Now())
	require.NoError(t, err)
	b.publishRaw(t, "runs."+workflow+".requested.run-b", mismatched.Data)
	b.request(t, newRequest("run-ok", 1, nil))

	ends := b.waitEnds(t, "run-ok", 1)
	require.Equal(t, contract.RunCompleted, ends[0].event)
	require.Eventually(t, func() bool { return eng.Stats().Malformed == 2 }, wait, tick)
	b.settled(t)
	require.Empty(t, b.ends(t, "run-b"))
}

// A request delivered again after its attempt ended (a crash before the
// ack, or a copy under another id) runs nothing: the end is published
// again under the same id, which RUNS drops.
func TestEndedAttemptIsNotRunAgain(t *testing.T) {
	t.Parallel()
	b := setup(t)
	eng, _ := b.start(t, engine.Config{FailFirst: -1})
	const run = "run-again"
	req := newRequest(run, 1, nil)
	b.request(t, req)
	b.waitEnds(t, run, 1)
	again, err := contract.NewRunMsg("test/triggers", contract.RunRequested, req, time.Now())
	require.NoError(t, err)
	b.publishRaw(t, again.Subject, again.Data)
	require.Eventually(t, func() bool { return eng.Stats().Replayed == 1 }, wait, tick)
	b.settled(t)
	require.Len(t, b.ends(t, run), 1)
	for _, n := range engine.NodeNames() {
		require.Len(t, b.record.Executions(t, run, n), 1, n)
	}
}

// A slow node sends heartbeats; a stop mid-node leaves the request
// unacknowledged, and the next engine skips the nodes the attempt
// finished, executes the interrupted one again and has its effect once.
func TestStopMidNodeResumesWithoutDuplicateEffect(t *testing.T) {
	t.Parallel()
	b := setup(t)
	_, stop := b.start(t, engine.Config{FailFirst: -1, SlowNode: engine.NodeNotify, SlowFor: time.Minute, Heartbeat: 100 * time.Millisecond})
	const run = "run-stop"
	b.request(t, newRequest(run, 1, nil))
	require.Eventually(t, func() bool { return b.record.Effects(t, run, engine.NodeNotify) == 1 }, wait, tick)
	heartbeats := "runs." + workflow + ".heartbeat." + run
	require.Eventually(t, func() bool {
		return len(natstestMessages(t, b, heartbeats)) >= 3
	}, wait, tick, "heartbeats while notify is slow")
	require.NoError(t, stop(), "a stop mid-node is clean")
	require.Empty(t, b.ends(t, run))

	b.start(t, engine.Config{FailFirst: -1, Executor: "engine-2"})
	ends := b.waitEnds(t, run, 1)
	require.Equal(t, contract.RunCompleted, ends[0].event)
	require.Equal(t, "engine-2", ends[0].data.Executor)
	require.Len(t, b.record.Executions(t, run, engine.NodeFetch), 1)
	require.Len(t, b.record.Executions(t, run, engine.NodeEnrich), 1)
	require.Len(t, b.record.Executions(t, run, engine.NodeNotify), 2)
	for _, n := range engine.NodeNames() {
		require.Equal(t, 1, b.record.Effects(t, run, n), "effect of %s", n)
	}
	require.Equal(t, []string{"fetch/completed", "enrich/completed", "notify/completed"}, summaries(b.steps(t, run), 1))
	b.settled(t)
}
