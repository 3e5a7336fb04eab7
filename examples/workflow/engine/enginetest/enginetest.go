// Package enginetest reads what the example engine recorded on its
// EFFECTS stream, for the tests of the engine and of the example's
// end-to-end run, which check both that each node ran and that its
// effect happened once.
package enginetest

import (
	"context"
	"encoding/json"
	"errors"
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

// messages reads the EFFECTS stream's messages on subject. The engine
// creates the stream when it starts: until then nothing is recorded, and
// a test polling from the engine's start must read nothing, not fail.
func (r Record) messages(t testing.TB, subject string) []jetstream.Msg {
	t.Helper()
	if _, err := r.JS.Stream(r.Ctx, engine.EffectsStream); errors.Is(err, jetstream.ErrStreamNotFound) {
		return nil
	}
	return natstest.Messages(t, r.Ctx, r.JS, engine.EffectsStream, subject)
}

// Executions are the executions of a run's node, in the order recorded.
func (r Record) Executions(t testing.TB, runID, node string) []engine.Execution {
	t.Helper()
	var out []engine.Execution
	for _, m := range r.messages(t, engine.ExecutionSubject(runID, node)) {
		var x engine.Execution
		require.NoError(t, json.Unmarshal(m.Data(), &x))
		out = append(out, x)
	}
	return out
}

// Effects counts the effects of a run's node.
func (r Record) Effects(t testing.TB, runID, node string) int {
	t.Helper()
	return len(r.messages(t, engine.EffectSubject(runID, node)))
}
