package contract

import (
	"encoding/json"
	"fmt"
	"strconv"
)

// Values of RunStepData.Status.
const (
	StepCompleted = "completed"
	StepFailed    = "failed"
)

// Limits on what a run carries from one attempt to the next: a retry's
// requested message holds every output, so they must fit in one message
// together.
const (
	MaxRunNodes        = 256
	MaxNodeOutputSize  = 64 << 10
	MaxCheckpointBytes = 256 << 10
)

// RunStepData reports one node of one attempt of a run, on
// runs.<workflow>.step.<run_id> with Nats-Msg-Id
// "run-step:<run_id>:<attempt>:<node>": a node is reported once per
// attempt, completed with its output or failed with its error. The
// triggers service records it in workflow_run_steps; the completed nodes
// are the checkpoint a retry resumes from.
type RunStepData struct {
	RunID    string `json:"run_id"`
	Workflow string `json:"workflow"`
	// Attempt is the run's attempt, as its requested message said; absent
	// means 1.
	Attempt int    `json:"attempt,omitempty"`
	Node    string `json:"node"`
	Status  string `json:"status"`
	// Output is a completed node's result, at most 64 KiB of JSON: what
	// the nodes after it read when a retry resumes.
	Output json.RawMessage `json:"output,omitempty"`
	// Error is required when Status is failed.
	Error    *ErrorInfo `json:"error,omitempty"`
	Executor string     `json:"executor,omitempty"`
}

// RunCheckpoint is where a retried run resumes: the last node that
// completed and the outputs of the nodes completed before it, by node id.
type RunCheckpoint struct {
	Node    string                     `json:"node"`
	Outputs map[string]json.RawMessage `json:"outputs,omitempty"`
}

// RunStepMsgID is the Nats-Msg-Id of a step report.
func RunStepMsgID(runID string, attempt int, node string) string {
	if attempt < 1 {
		attempt = 1
	}
	return RunMsgID(RunStep, runID) + ":" + strconv.Itoa(attempt) + ":" + node
}

// Validate checks a step report.
func (d RunStepData) Validate() error {
	if err := validateRunReport(d.RunID, d.Workflow, d.Attempt); err != nil {
		return err
	}
	if err := ValidateID("data.node", d.Node); err != nil {
		return err
	}
	if err := ValidateExecutor("data.executor", d.Executor); err != nil {
		return err
	}
	switch d.Status {
	case StepCompleted:
		if d.Error != nil {
			return fieldErr("data.error", "must be absent when status is completed")
		}
		return checkOutput("data.output", d.Output)
	case StepFailed:
		if d.Error == nil {
			return fieldErr("data.error", "is required when status is failed")
		}
		if len(d.Output) != 0 {
			return fieldErr("data.output", "must be absent when status is failed")
		}
		return validateError(*d.Error)
	case "":
		return fieldErr("data.status", "is required")
	default:
		return fieldErr("data.status", fmt.Sprintf("%q is not completed or failed", d.Status))
	}
}

func (c RunCheckpoint) validate(field string) error {
	if err := ValidateID(field+".node", c.Node); err != nil {
		return err
	}
	if len(c.Outputs) > MaxRunNodes {
		return fieldErr(field+".outputs", fmt.Sprintf("has %d nodes, more than the limit of %d", len(c.Outputs), MaxRunNodes))
	}
	total := 0
	for node, out := range c.Outputs {
		if err := ValidateID(field+".outputs key", node); err != nil {
			return err
		}
		if err := checkOutput(field+".outputs."+node, out); err != nil {
			return err
		}
		total += len(out)
	}
	if total > MaxCheckpointBytes {
		return tooLarge(field+".outputs", total, MaxCheckpointBytes)
	}
	return nil
}

func checkOutput(field string, raw json.RawMessage) error {
	if len(raw) > MaxNodeOutputSize {
		return tooLarge(field, len(raw), MaxNodeOutputSize)
	}
	return checkRaw(field, raw)
}

// validateRunReport checks what every report of a run attempt names: the
// run, its workflow and the attempt.
func validateRunReport(runID, workflow string, attempt int) error {
	if err := ValidateID("data.run_id", runID); err != nil {
		return err
	}
	if err := ValidateToken("data.workflow", workflow); err != nil {
		return err
	}
	return validateRunAttempt(attempt)
}

func validateRunAttempt(attempt int) error {
	if attempt < 0 || attempt > MaxAttempt {
		return fieldErr("data.attempt", fmt.Sprintf("%d is outside 0..%d (0 or absent means 1)", attempt, MaxAttempt))
	}
	return nil
}

// DecodeRunStep strictly decodes a runs.*.step.* message.
func DecodeRunStep(subject string, body []byte) (Envelope, RunStepData, error) {
	return decodeRun[RunStepData](subject, body)
}
