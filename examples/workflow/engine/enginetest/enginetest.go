// Package enginetest reads what the example engine recorded on its
// EFFECTS stream, for the tests of the engine and of the example's
// end-to-end run, which check both that each node ran and that its
// effect happened once.
package enginetest

import (
	"context"
	"encoding/json"
	"testing"

	"github.com/nats-io/nats.go/jetstream"
	"github.com/stretchr/testify/require"

	"github.com/retryd/retryd/examples/workflow/engine"
	"github.com/retryd/retryd/internal/natstest"
)

// Record is the EFFECTS stream of the server at JS.
type Record struct {
	Ctx context.Context
	JS  jetstream.JetStream
}

// Executions are the executions of a run's node, in the order recorded.
func (r Record) Executions(t testing.TB, runID, node string) []engine.Execution {
	t.Helper()
	var out []engine.Execution
	for _, m := range natstest.Messages(t, r.Ctx, r.JS, engine.EffectsStream, engine.ExecutionSubject(runID, node)) {
		var x engine.Execution
		require.NoError(t, json.Unmarshal(m.Data(), &x))
		out = append(out, x)
	}
	return out
}

// Effects counts the effects of a run's node.
func (r Record) Effects(t testing.TB, runID, node string) int {
	t.Helper()
	return len(natstest.Messages(t, r.Ctx, r.JS, engine.EffectsStream, engine.EffectSubject(runID, node)))
}
