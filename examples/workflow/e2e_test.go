package main_test

import (
	"testing"

	"github.com/stretchr/testify/require"

	"github.com/retryd/retryd/examples/workflow/engine"
	"github.com/retryd/retryd/internal/natstest"
	"github.com/retryd/retryd/pkg/contract"
)

// A trigger launches a run of the engine's workflow from an event posted
// to ingress. enrich fails twice with class network; triggers fails the
// run twice, the scheduler brings it back each time, and the engine
// resumes after fetch with fetch's output until the third attempt
// completes. Each node's effect happens once.
func TestTriggeredRunRetriesFromCheckpoint(t *testing.T) {
	t.Parallel()
	e := setup(t)
	eng := e.start(t, "engine-a")
	runID := e.launch(t, "shop")

	// Without the triggers side of run retries (a failed run stays
	// failed and no step is recorded) there is nothing more to check.
	var r run
	require.Eventually(t, func() bool {
		r = e.run(t, runID)
		return r.Attempt > 1 || (r.Status != "requested" && r.Status != "in_progress")
	}, wait, tick, "run %s: %+v", runID, r)
	if r.Status == "failed" && len(e.steps(t, runID)) == 0 {
		t.Skip("triggers does not retry runs on this branch yet (the run failed at its first attempt and no step was recorded): merge main once run retries are on it")
	}

	r = e.waitRun(t, runID, "completed", "failed", "failed_max_retries")
	require.Equal(t, "completed", r.Status, "run %+v", r)
	require.Equal(t, 2, r.RetryCount)
	require.Equal(t, 3, r.Attempt)
	require.Equal(t, "engine-a", r.Executor)
	require.Equal(t, "network", r.LastErrorClass, "the last failure is kept")

	outputs := e.stepOutputs(t, runID)
	require.Len(t, e.record.Executions(t, runID, engine.NodeFetch), 1, "fetch ran once")
	enrich := e.record.Executions(t, runID, engine.NodeEnrich)
	require.Len(t, enrich, 3, "enrich ran three times")
	for i, x := range enrich {
		require.Equal(t, i+1, x.Attempt)
		require.JSONEq(t, string(outputs[engine.NodeFetch]), string(x.Input), "enrich's execution %d gets fetch's output", i+1)
	}
	notify := e.record.Executions(t, runID, engine.NodeNotify)
	require.Len(t, notify, 1, "notify ran once")
	require.JSONEq(t, string(outputs[engine.NodeEnrich]), string(notify[0].Input))
	for _, n := range engine.NodeNames() {
		require.Equal(t, 1, e.record.Effects(t, runID, n), "effect of %s", n)
	}

	// The triggers service applies each step report apart from the run's
	// end, so the last node's step may land just after "completed".
	require.Eventually(t, func() bool { return len(e.steps(t, runID)) == 3 }, wait, tick, "every node's step recorded")
	steps := e.steps(t, runID)
	require.Len(t, steps, 3, "steps: %+v", steps)
	want := []struct {
		node, retryState, lastErrorClass string
		attempts, runAttempt             int
	}{
		{engine.NodeFetch, "none", "", 1, 1},
		{engine.NodeEnrich, "succeeded", "network", 3, 3},
		{engine.NodeNotify, "none", "", 1, 3},
	}
	for i, w := range want {
		s := steps[i]
		require.Equal(t, w.node, s.Node, "step %d by reported_at: %+v", i, steps)
		require.Equal(t, "completed", s.Status, "%+v", s)
		require.Equal(t, w.retryState, s.RetryState, "%+v", s)
		require.Equal(t, w.lastErrorClass, s.LastErrorClass, "%+v", s)
		require.Equal(t, w.attempts, s.Attempts, "%+v", s)
		require.Equal(t, w.runAttempt, s.RunAttempt, "%+v", s)
		require.Equal(t, "engine-a", s.Executor, "%+v", s)
		require.JSONEq(t, string(outputs[w.node]), string(s.Output), "%s's output", w.node)
	}

	// The retries asked for attempts 2 and 3 from fetch's checkpoint.
	var requested []contract.RunRequestedData
	for _, m := range natstest.Messages(t, e.ctx, e.js, contract.StreamRuns, contract.RunSubject(workflow, contract.RunRequested, runID)) {
		_, d, err := contract.DecodeRunRequested(m.Subject(), m.Data())
		require.NoError(t, err)
		requested = append(requested, d)
	}
	require.Len(t, requested, 3)
	for i, d := range requested {
		require.Equal(t, i+1, max(d.Attempt, 1))
		if i == 0 {
			require.Nil(t, d.ResumeFrom)
			continue
		}
		require.NotNil(t, d.ResumeFrom, "attempt %d", i+1)
		require.Equal(t, engine.NodeFetch, d.ResumeFrom.Node)
		require.JSONEq(t, string(outputs[engine.NodeFetch]), string(d.ResumeFrom.Outputs[engine.NodeFetch]))
	}
	require.Len(t, natstest.Messages(t, e.ctx, e.js, contract.StreamRetries, "retry.run.failed."+runID), 2)
	require.Eventually(t, func() bool {
		return len(natstest.Messages(t, e.ctx, e.js, contract.StreamRetries, "retry.run.succeeded."+runID)) == 1
	}, wait, tick, "the scheduler's row of the run is closed")

	eng.terminate(t)
}

// The engine is killed (SIGKILL) after notify's effect and before it
// reported notify; RUNS redelivers the request to the engine started in
// its place, which skips the nodes the attempt finished, executes notify
// again and has its effect once.
func TestKilledEngineHasEachEffectOnce(t *testing.T) {
	t.Parallel()
	e := setup(t)
	slow := e.start(t, "engine-a", "-fail-first", "-1", "-slow-node", engine.NodeNotify, "-slow-for", "5m")
	runID := e.launch(t, "kill")
	require.Eventually(t, func() bool { return e.record.Effects(t, runID, engine.NodeNotify) == 1 }, wait, tick, "notify's effect")
	slow.kill(t)
	_, reported := e.stepOutputs(t, runID)[engine.NodeNotify]
	require.False(t, reported, "notify was not reported before the kill")

	again := e.start(t, "engine-b", "-fail-first", "-1")
	r := e.waitRun(t, runID, "completed", "failed", "failed_max_retries")
	require.Equal(t, "completed", r.Status, "run %+v", r)
	require.Equal(t, 0, r.RetryCount)

	require.Len(t, e.record.Executions(t, runID, engine.NodeFetch), 1)
	require.Len(t, e.record.Executions(t, runID, engine.NodeEnrich), 1)
	require.Len(t, e.record.Executions(t, runID, engine.NodeNotify), 2, "notify executed again after the kill")
	for _, n := range engine.NodeNames() {
		require.Equal(t, 1, e.record.Effects(t, runID, n), "effect of %s", n)
	}
	ends := natstest.Messages(t, e.ctx, e.js, contract.StreamRuns, contract.RunSubject(workflow, contract.RunCompleted, runID))
	require.Len(t, ends, 1)
	_, end, err := contract.DecodeRunFinished(ends[0].Subject(), ends[0].Data())
	require.NoError(t, err)
	require.Equal(t, contract.RunFinishedData{RunID: runID, Workflow: workflow, Attempt: 1, Executor: "engine-b"}, end)
	require.Len(t, e.stepOutputs(t, runID), 3, "each node reported completed")

	again.terminate(t)
}
