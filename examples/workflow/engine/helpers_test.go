package engine_test

import (
	"context"
	"encoding/json"
	"testing"
	"time"

	"github.com/nats-io/nats.go"
	"github.com/nats-io/nats.go/jetstream"
	"github.com/stretchr/testify/require"

	"github.com/retryd/retryd/examples/workflow/engine"
	"github.com/retryd/retryd/examples/workflow/engine/enginetest"
	"github.com/retryd/retryd/internal/natstest"
	"github.com/retryd/retryd/internal/servicetest"
	"github.com/retryd/retryd/pkg/contract"
)

// wait bounds every wait; the tests poll, never sleep.
const wait = 20 * time.Second

const tick = 10 * time.Millisecond

const workflow = "orders"

type bundle struct {
	ctx context.Context
	js  jetstream.JetStream
	// record is what the engine recorded on its EFFECTS stream.
	record enginetest.Record
}

// setup starts embedded NATS with retryd's streams.
func setup(t *testing.T) *bundle {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), 2*time.Minute)
	t.Cleanup(cancel)
	srv := natstest.RunServer(t)
	_, js := natstest.Connect(t, srv)
	natstest.EnsureStreams(t, js)
	return &bundle{ctx: ctx, js: js, record: enginetest.Record{Ctx: ctx, JS: js}}
}

// start runs an engine until the returned stop is called (or the test
// ends); stop waits for Run to return and hands back its error.
func (b *bundle) start(t *testing.T, cfg engine.Config) (*engine.Engine, func() error) {
	t.Helper()
	cfg.JS, cfg.Workflow, cfg.Logger = b.js, workflow, servicetest.Logger(t)
	if cfg.Executor == "" {
		cfg.Executor = "engine-1"
	}
	if cfg.AckWait == 0 {
		cfg.AckWait = 2 * time.Second
	}
	cfg.FetchWait = 100 * time.Millisecond
	eng, err := engine.New(b.ctx, cfg)
	require.NoError(t, err)
	ctx, cancel := context.WithCancel(b.ctx)
	done := make(chan error, 1)
	go func() { done <- eng.Run(ctx) }()
	stopped := false
	stop := func() error {
		cancel()
		if stopped {
			return nil
		}
		stopped = true
		return <-done
	}
	t.Cleanup(func() { _ = stop() })
	return eng, stop
}

// request publishes a run request as triggers would.
func (b *bundle) request(t *testing.T, req contract.RunRequestedData) {
	t.Helper()
	msg, err := contract.NewRunMsg("test/triggers", contract.RunRequested, req, time.Now())
	require.NoError(t, err)
	_, err = b.js.PublishMsg(b.ctx, msg)
	require.NoError(t, err)
}

func newRequest(runID string, attempt int, resume *contract.RunCheckpoint) contract.RunRequestedData {
	return contract.RunRequestedData{
		RunID: runID, Workflow: workflow, TriggerID: "trg-1", TriggerVersion: 1, DeliveryID: "dlv-" + runID,
		EventID: "evt-" + runID, Event: json.RawMessage(`{"order":42}`), Attempt: attempt, ResumeFrom: resume,
	}
}

// publishRaw publishes a body on subject under a fresh id.
func (b *bundle) publishRaw(t *testing.T, subject string, body []byte) {
	t.Helper()
	msg := nats.NewMsg(subject)
	msg.Data = body
	msg.Header.Set(contract.HeaderMsgID, contract.NewID())
	_, err := b.js.PublishMsg(b.ctx, msg)
	require.NoError(t, err)
}

func (b *bundle) steps(t *testing.T, runID string) []contract.RunStepData {
	t.Helper()
	var out []contract.RunStepData
	for _, m := range natstest.Messages(t, b.ctx, b.js, contract.StreamRuns, contract.RunSubject(workflow, contract.RunStep, runID)) {
		_, d, err := contract.DecodeRunStep(m.Subject(), m.Data())
		require.NoError(t, err)
		out = append(out, d)
	}
	return out
}

// finished is a run's end as published.
type finished struct {
	event string
	msgID string
	data  contract.RunFinishedData
}

func (b *bundle) ends(t *testing.T, runID string) []finished {
	t.Helper()
	var out []finished
	for _, m := range natstest.Messages(t, b.ctx, b.js, contract.StreamRuns, "runs."+workflow+".*."+runID) {
		p, err := contract.ParseRunSubject(m.Subject())
		require.NoError(t, err)
		if p.Event != contract.RunCompleted && p.Event != contract.RunFailed {
			continue
		}
		_, d, err := contract.DecodeRunFinished(m.Subject(), m.Data())
		require.NoError(t, err)
		out = append(out, finished{event: p.Event, msgID: m.Headers().Get(contract.HeaderMsgID), data: d})
	}
	return out
}

// waitEnds waits until the run has n ends on RUNS.
func (b *bundle) waitEnds(t *testing.T, runID string, n int) []finished {
	t.Helper()
	var got []finished
	require.Eventually(t, func() bool {
		got = b.ends(t, runID)
		return len(got) >= n
	}, wait, tick, "ends of %s: %+v", runID, got)
	return got
}

// settled waits until the engine's consumer has nothing pending or
// unacknowledged.
func (b *bundle) settled(t *testing.T) {
	t.Helper()
	require.Eventually(t, func() bool {
		c, err := b.js.Consumer(b.ctx, contract.StreamRuns, "workflow-"+workflow)
		if err != nil {
			return false
		}
		info, err := c.Info(b.ctx)
		return err == nil && info.NumPending == 0 && info.NumAckPending == 0
	}, wait, tick)
}

// summary is a step as the tests compare it.
func summary(s contract.RunStepData) string {
	out := s.Node + "/" + s.Status
	if s.Error != nil {
		out += "/" + s.Error.Class
	}
	return out
}

func summaries(steps []contract.RunStepData, attempt int) []string {
	var out []string
	for _, s := range steps {
		if s.Attempt == attempt {
			out = append(out, summary(s))
		}
	}
	return out
}

func natstestMessages(t *testing.T, b *bundle, filter string) []jetstream.Msg {
	t.Helper()
	return natstest.Messages(t, b.ctx, b.js, contract.StreamRuns, filter)
}
