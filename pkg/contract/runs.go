package contract

import (
	"encoding/json"
	"fmt"
	"slices"
	"strconv"
	"strings"
	"time"

	"github.com/nats-io/nats.go"
)

// RunRequestedData asks for a workflow run; published by triggers on
// runs.<workflow>.requested.<run_id> with Nats-Msg-Id
// "run-requested:<run_id>" for the first attempt and
// "run-requested:<run_id>:<attempt>" for a retry.
type RunRequestedData struct {
	RunID          string          `json:"run_id"`
	Workflow       string          `json:"workflow"`
	TriggerID      string          `json:"trigger_id"`
	TriggerVersion int             `json:"trigger_version"`
	DeliveryID     string          `json:"delivery_id"`
	EventID        string          `json:"event_id"`
	Event          json.RawMessage `json:"event,omitempty"`
	// Attempt is the run's attempt, 1 for the first; absent means 1.
	Attempt int `json:"attempt,omitempty"`
	// ResumeFrom is set on a retry whose earlier attempts completed
	// nodes: the executor skips them, using their outputs, and runs the
	// node after ResumeFrom.Node.
	ResumeFrom *RunCheckpoint `json:"resume_from,omitempty"`
}

// RunFinishedData reports a run's end on runs.<workflow>.completed.<run_id>
// or runs.<workflow>.failed.<run_id>.
type RunFinishedData struct {
	RunID    string     `json:"run_id"`
	Workflow string     `json:"workflow"`
	Error    *ErrorInfo `json:"error,omitempty"`
	// Attempt is the attempt that ended, as its requested message said;
	// absent means 1. It is part of the Nats-Msg-Id, so the end of a
	// retry is not dropped as a duplicate of the first attempt's.
	Attempt int `json:"attempt,omitempty"`
	// Node is the node a failed run failed at, when the executor knows.
	Node string `json:"node,omitempty"`
	// Executor names the engine instance that ran the attempt.
	Executor string `json:"executor,omitempty"`
}

// RunHeartbeatData renews the lease of a run in flight; published by
// whatever executes the run on runs.<workflow>.heartbeat.<run_id>, as
// often as it likes but well within the trigger's run timeout. Each
// heartbeat has its own Nats-Msg-Id (RunHeartbeatMsgID): one id per run
// would make the stream's duplicate window drop every heartbeat but the
// first.
type RunHeartbeatData struct {
	RunID    string `json:"run_id"`
	Workflow string `json:"workflow"`
}

// RunMsgID is the Nats-Msg-Id of a run's first requested, completed or
// failed event: "run-<event>:<run_id>". See RunAttemptMsgID for retries.
func RunMsgID(event, runID string) string { return "run-" + event + ":" + runID }

// RunAttemptMsgID is the Nats-Msg-Id of a requested, completed or failed
// event of attempt: RunMsgID for the first (as before retries existed),
// "run-<event>:<run_id>:<attempt>" for the others.
func RunAttemptMsgID(event, runID string, attempt int) string {
	if attempt <= 1 {
		return RunMsgID(event, runID)
	}
	return RunMsgID(event, runID) + ":" + strconv.Itoa(attempt)
}

// RunHeartbeatMsgID is the Nats-Msg-Id of a heartbeat:
// "run-heartbeat:<run_id>:<unix nanoseconds>". A publish retried with the
// same message keeps its id, so the stream stores it once.
func RunHeartbeatMsgID(runID string, at time.Time) string {
	return RunMsgID(RunHeartbeat, runID) + ":" + strconv.FormatInt(at.UnixNano(), 10)
}

// Validate checks a heartbeat.
func (d RunHeartbeatData) Validate() error {
	if err := ValidateID("data.run_id", d.RunID); err != nil {
		return err
	}
	return ValidateToken("data.workflow", d.Workflow)
}

// Validate checks a run request.
func (d RunRequestedData) Validate() error {
	for _, f := range []struct{ name, v string }{{"data.run_id", d.RunID}, {"data.trigger_id", d.TriggerID}, {"data.delivery_id", d.DeliveryID}, {"data.event_id", d.EventID}} {
		if err := ValidateID(f.name, f.v); err != nil {
			return err
		}
	}
	if err := ValidateToken("data.workflow", d.Workflow); err != nil {
		return err
	}
	if err := validateRunAttempt(d.Attempt); err != nil {
		return err
	}
	if d.ResumeFrom != nil {
		if err := d.ResumeFrom.validate("data.resume_from"); err != nil {
			return err
		}
	}
	return checkRaw("data.event", d.Event)
}

// Validate checks a run completion or failure.
func (d RunFinishedData) Validate() error {
	if err := validateRunReport(d.RunID, d.Workflow, d.Attempt); err != nil {
		return err
	}
	if d.Node != "" {
		if err := ValidateID("data.node", d.Node); err != nil {
			return err
		}
	}
	if err := ValidateExecutor("data.executor", d.Executor); err != nil {
		return err
	}
	if d.Error != nil {
		return validateError(*d.Error)
	}
	return nil
}

// runData is what NewRunMsg and the decoders need of each kind of run
// data.
type runData interface {
	Validate() error
	run() (workflow, runID string)
	// events are the RUNS events the data goes with.
	events() []string
	msgID(event string, now time.Time) string
}

func (d RunRequestedData) run() (string, string) { return d.Workflow, d.RunID }
func (d RunFinishedData) run() (string, string)  { return d.Workflow, d.RunID }
func (d RunHeartbeatData) run() (string, string) { return d.Workflow, d.RunID }
func (d RunStepData) run() (string, string)      { return d.Workflow, d.RunID }

func (RunRequestedData) events() []string { return []string{RunRequested} }
func (RunFinishedData) events() []string  { return []string{RunCompleted, RunFailed} }
func (RunHeartbeatData) events() []string { return []string{RunHeartbeat} }
func (RunStepData) events() []string      { return []string{RunStep} }

func (d RunRequestedData) msgID(event string, _ time.Time) string {
	return RunAttemptMsgID(event, d.RunID, d.Attempt)
}
func (d RunFinishedData) msgID(event string, _ time.Time) string {
	return RunAttemptMsgID(event, d.RunID, d.Attempt)
}
func (d RunHeartbeatData) msgID(_ string, now time.Time) string {
	return RunHeartbeatMsgID(d.RunID, now)
}
func (d RunStepData) msgID(_ string, _ time.Time) string {
	return RunStepMsgID(d.RunID, d.Attempt, d.Node)
}

// NewRunMsg builds a RUNS message; data is RunRequestedData for
// "requested", RunFinishedData for "completed" and "failed",
// RunHeartbeatData for "heartbeat" and RunStepData for "step".
func NewRunMsg(source, event string, data interface{ Validate() error }, now time.Time) (*nats.Msg, error) {
	d, ok := data.(runData)
	if !ok {
		return nil, fieldErr("data", fmt.Sprintf("%T is not run data", data))
	}
	if !slices.Contains(d.events(), event) {
		return nil, fieldErr("event", fmt.Sprintf("%T goes with %s", data, strings.Join(d.events(), " or ")))
	}
	if err := d.Validate(); err != nil {
		return nil, fmt.Errorf("build run %s event: %w", event, err)
	}
	raw, err := json.Marshal(data)
	if err != nil {
		return nil, fmt.Errorf("marshal run data: %w", err)
	}
	workflow, runID := d.run()
	return newEnvelopeMsg(RunSubject(workflow, event, runID), d.msgID(event, now), source, "run."+event, raw, now)
}

// decodeRun strictly decodes a RUNS message whose data is a T: the
// subject's event must be one T goes with, and its workflow and run id
// the data's.
func decodeRun[T any, PT interface {
	*T
	runData
}](subject string, body []byte) (Envelope, T, error) {
	var d T
	env, err := decodeTyped(subject, body, &d, func() error {
		p, err := ParseRunSubject(subject)
		if err != nil {
			return err
		}
		pd := PT(&d)
		if !slices.Contains(pd.events(), p.Event) {
			return fieldErr("subject event", fmt.Sprintf("%q is not %s", p.Event, strings.Join(pd.events(), " or ")))
		}
		if err := pd.Validate(); err != nil {
			return err
		}
		workflow, runID := pd.run()
		return matchRunSubject(p, workflow, runID)
	})
	return env, d, err
}

// DecodeRunRequested strictly decodes a runs.*.requested.* message.
func DecodeRunRequested(subject string, body []byte) (Envelope, RunRequestedData, error) {
	return decodeRun[RunRequestedData](subject, body)
}

// DecodeRunFinished strictly decodes a runs.*.completed.* or runs.*.failed.*
// message.
func DecodeRunFinished(subject string, body []byte) (Envelope, RunFinishedData, error) {
	return decodeRun[RunFinishedData](subject, body)
}

// DecodeRunHeartbeat strictly decodes a runs.*.heartbeat.* message.
func DecodeRunHeartbeat(subject string, body []byte) (Envelope, RunHeartbeatData, error) {
	return decodeRun[RunHeartbeatData](subject, body)
}

// matchRunSubject checks that the data is about the run its subject names.
// The data is validated first, so a malformed id is reported as such and
// not as a mismatch.
func matchRunSubject(p RunSubjectParts, workflow, runID string) error {
	if p.Workflow != workflow {
		return fieldErr("data.workflow", fmt.Sprintf("%q does not match subject workflow %q", workflow, p.Workflow))
	}
	if p.RunID != runID {
		return fieldErr("data.run_id", fmt.Sprintf("%q does not match subject run_id %q", runID, p.RunID))
	}
	return nil
}

func decodeTyped(_ string, body []byte, v any, check func() error) (Envelope, error) {
	env, err := DecodeEnvelope(body)
	if err != nil {
		return Envelope{}, err
	}
	if len(env.Data) == 0 {
		return Envelope{}, fieldErr("data", "is required")
	}
	if err := decodeShaped("data", env.Data, v); err != nil {
		return Envelope{}, err
	}
	return env, check()
}

func newEnvelopeMsg(subject, msgID, source, typ string, data json.RawMessage, now time.Time) (*nats.Msg, error) {
	env := Envelope{
		SpecVersion:     SpecVersion,
		ID:              msgID,
		Source:          source,
		Type:            typ,
		Time:            now.UTC(),
		DataContentType: ContentTypeJSON,
		Data:            data,
	}
	body, err := env.Marshal()
	if err != nil {
		return nil, err
	}
	msg := nats.NewMsg(subject)
	msg.Data = body
	msg.Header.Set(HeaderMsgID, msgID)
	msg.Header.Set(HeaderContentType, ContentTypeJSON)
	if err := checkMsgSize(msg); err != nil {
		return nil, err
	}
	return msg, nil
}

// checkMsgSize refuses a message the streams would refuse: their max
// message size, MaxEnvelopeBytes, counts headers and body. Without it a
// payload and a checkpoint of MaxDataBytes each build an envelope that no
// stream stores and no decoder accepts.
func checkMsgSize(msg *nats.Msg) error {
	size := len(msg.Data) + len("NATS/1.0\r\n\r\n")
	for k, vs := range msg.Header {
		for _, v := range vs {
			size += len(k) + len(": \r\n") + len(v)
		}
	}
	if size > MaxEnvelopeBytes {
		return tooLarge("envelope", size, MaxEnvelopeBytes)
	}
	return nil
}

// NewEventMsg builds the message for a producer event on INGEST or EVENTS:
// the envelope as body and its id as Nats-Msg-Id.
func NewEventMsg(subject string, env Envelope) (*nats.Msg, error) {
	if err := ValidateEventEnvelope(env); err != nil {
		return nil, err
	}
	body, err := env.Marshal()
	if err != nil {
		return nil, err
	}
	msg := nats.NewMsg(subject)
	msg.Data = body
	msg.Header.Set(HeaderMsgID, env.ID)
	msg.Header.Set(HeaderContentType, ContentTypeJSON)
	if err := checkMsgSize(msg); err != nil {
		return nil, err
	}
	return msg, nil
}

// DecodeEventMsg strictly decodes a producer event from INGEST or EVENTS,
// its extension attributes into Extensions.
func DecodeEventMsg(body []byte) (Envelope, error) {
	if err := checkShape("envelope", body, MaxEnvelopeBytes); err != nil {
		return Envelope{}, err
	}
	core, ext, err := splitExtensions(body)
	if err != nil {
		return Envelope{}, err
	}
	env, err := DecodeEnvelope(core)
	if err != nil {
		return Envelope{}, err
	}
	env.Extensions = ext
	return env, ValidateEventEnvelope(env)
}
