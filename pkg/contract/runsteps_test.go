package contract_test

import (
	"encoding/json"
	"strings"
	"testing"

	"github.com/stretchr/testify/require"

	"github.com/retryd/retryd/pkg/contract"
)

func TestRunStepRoundTrip(t *testing.T) {
	t.Parallel()
	for _, d := range []contract.RunStepData{
		{RunID: "r1", Workflow: "onboard", Attempt: 2, Node: "enrich", Status: contract.StepCompleted,
			Output: json.RawMessage(`{"score":7}`), Executor: "engine-1"},
		{RunID: "r1", Workflow: "onboard", Node: "send", Status: contract.StepFailed,
			Error: &contract.ErrorInfo{Class: "network", Message: "connection reset"}},
	} {
		msg, err := contract.NewRunMsg("test", contract.RunStep, d, now)
		require.NoError(t, err)
		require.Equal(t, "runs.onboard.step.r1", msg.Subject)
		require.Equal(t, contract.RunStepMsgID(d.RunID, d.Attempt, d.Node), msg.Header.Get(contract.HeaderMsgID))
		_, got, err := contract.DecodeRunStep(msg.Subject, msg.Data)
		require.NoError(t, err)
		require.Equal(t, d, got)
	}
	require.Equal(t, "run-step:r1:1:a", contract.RunStepMsgID("r1", 0, "a"), "absent attempt is the first")
}

func TestRunStepRefuses(t *testing.T) {
	t.Parallel()
	ok := contract.RunStepData{RunID: "r1", Workflow: "wf", Node: "n1", Status: contract.StepCompleted}
	for _, tc := range []struct {
		field  string
		target error
		edit   func(*contract.RunStepData)
	}{
		{"data.status", contract.ErrInvalid, func(d *contract.RunStepData) { d.Status = "" }},
		{"data.status", contract.ErrInvalid, func(d *contract.RunStepData) { d.Status = "running" }},
		{"data.node", contract.ErrInvalid, func(d *contract.RunStepData) { d.Node = "a.b" }},
		{"data.attempt", contract.ErrInvalid, func(d *contract.RunStepData) { d.Attempt = -1 }},
		{"data.error", contract.ErrInvalid, func(d *contract.RunStepData) { d.Status = contract.StepFailed }},
		{"data.error", contract.ErrInvalid, func(d *contract.RunStepData) { d.Error = &contract.ErrorInfo{Message: "x"} }},
		{"data.output", contract.ErrInvalid, func(d *contract.RunStepData) {
			d.Status, d.Error, d.Output = contract.StepFailed, &contract.ErrorInfo{Message: "x"}, json.RawMessage(`1`)
		}},
		{"data.output", contract.ErrTooLarge, func(d *contract.RunStepData) {
			d.Output = json.RawMessage(`"` + strings.Repeat("x", contract.MaxNodeOutputSize) + `"`)
		}},
	} {
		d := ok
		tc.edit(&d)
		_, err := contract.NewRunMsg("test", contract.RunStep, d, now)
		requireFieldErr(t, err, tc.target, tc.field)
	}
	_, err := contract.NewRunMsg("test", contract.RunCompleted, ok, now)
	requireFieldErr(t, err, contract.ErrInvalid, "event")

	// A step on another subject, and a subject that names another run.
	msg, err := contract.NewRunMsg("test", contract.RunStep, ok, now)
	require.NoError(t, err)
	_, _, err = contract.DecodeRunStep("runs.wf.completed.r1", msg.Data)
	requireFieldErr(t, err, contract.ErrInvalid, "subject event")
	_, _, err = contract.DecodeRunStep("runs.wf.step.r2", msg.Data)
	requireFieldErr(t, err, contract.ErrInvalid, "data.run_id")
}

func TestRunRetryMsgIDs(t *testing.T) {
	t.Parallel()
	req := contract.RunRequestedData{RunID: "r1", Workflow: "wf", TriggerID: "t1", DeliveryID: "d1", EventID: "e1"}
	msg, err := contract.NewRunMsg("test", contract.RunRequested, req, now)
	require.NoError(t, err)
	require.Equal(t, "run-requested:r1", msg.Header.Get(contract.HeaderMsgID), "first attempts keep the id they had")

	req.Attempt = 3
	req.ResumeFrom = &contract.RunCheckpoint{Node: "n1", Outputs: map[string]json.RawMessage{"n1": json.RawMessage(`{"a":1}`)}}
	msg, err = contract.NewRunMsg("test", contract.RunRequested, req, now)
	require.NoError(t, err)
	require.Equal(t, "run-requested:r1:3", msg.Header.Get(contract.HeaderMsgID))
	_, got, err := contract.DecodeRunRequested(msg.Subject, msg.Data)
	require.NoError(t, err)
	require.Equal(t, req, got)

	fin := contract.RunFinishedData{RunID: "r1", Workflow: "wf", Attempt: 3, Node: "n2",
		Error: &contract.ErrorInfo{Class: "network", Message: "reset"}}
	msg, err = contract.NewRunMsg("test", contract.RunFailed, fin, now)
	require.NoError(t, err)
	require.Equal(t, "run-failed:r1:3", msg.Header.Get(contract.HeaderMsgID))

	req.ResumeFrom = &contract.RunCheckpoint{Node: "n1", Outputs: map[string]json.RawMessage{}}
	for i := 0; i < 5; i++ {
		req.ResumeFrom.Outputs[string(rune('a'+i))] = json.RawMessage(`"` + strings.Repeat("x", contract.MaxNodeOutputSize-10) + `"`)
	}
	_, err = contract.NewRunMsg("test", contract.RunRequested, req, now)
	requireFieldErr(t, err, contract.ErrTooLarge, "data.resume_from.outputs")
}
