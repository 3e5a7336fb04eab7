package contract_test

import (
	"encoding/json"
	"strings"
	"testing"
	"time"

	"github.com/stretchr/testify/require"

	"github.com/retryd/retryd/pkg/contract"
)

func TestDecodeProducerEvent(t *testing.T) {
	t.Parallel()
	ev, err := contract.DecodeProducerEvent([]byte(`{"source":"shop","type":"invoice.paid","data":{"amount":12}}`))
	require.NoError(t, err)
	require.Equal(t, "shop", ev.Source)
	require.Equal(t, "invoice.paid", ev.Type)
	require.JSONEq(t, `{"amount":12}`, string(ev.Data))

	env := ev.Envelope("01JFALLBACK", now.In(time.FixedZone("x", 3600)))
	require.Equal(t, contract.Envelope{
		SpecVersion: "1.0", ID: "01JFALLBACK", Source: "shop", Type: "invoice.paid", Time: now, Data: ev.Data,
	}, env)

	full := `{"specversion":"1.0","id":"evt-1","source":"shop","type":"invoice.paid","time":"2025-01-01T00:00:00+02:00",` +
		`"subject":"inv/42","datacontenttype":"application/json","data":[1,2]}`
	ev, err = contract.DecodeProducerEvent([]byte(full))
	require.NoError(t, err)
	env = ev.Envelope("unused", now)
	require.Equal(t, "evt-1", env.ID)
	require.Equal(t, time.Date(2024, 12, 31, 22, 0, 0, 0, time.UTC), env.Time)
	require.Equal(t, "inv/42", env.Subject)
	require.NoError(t, contract.ValidateEventEnvelope(env))
}

func TestEventMsgRoundTrip(t *testing.T) {
	t.Parallel()
	env := contract.Envelope{SpecVersion: "1.0", ID: "01JEVT", Source: "shop", Type: "invoice.paid", Time: now,
		DataContentType: contract.ContentTypeJSON, Data: json.RawMessage(`{"amount":12}`)}
	for _, subject := range []string{contract.IngestSubject("shop"), contract.EventSubject("shop", "invoice.paid")} {
		msg, err := contract.NewEventMsg(subject, env)
		require.NoError(t, err)
		require.Equal(t, subject, msg.Subject)
		require.Equal(t, "01JEVT", msg.Header.Get(contract.HeaderMsgID))
		require.Equal(t, contract.ContentTypeJSON, msg.Header.Get(contract.HeaderContentType))
		got, err := contract.DecodeEventMsg(msg.Data)
		require.NoError(t, err)
		require.Equal(t, env, got)
	}
}

func TestNewEventMsgRefuses(t *testing.T) {
	t.Parallel()
	base := contract.Envelope{SpecVersion: "1.0", ID: "e1", Source: "shop", Type: "a.b", Time: now}
	tests := []struct {
		name   string
		mutate func(*contract.Envelope)
		target error
		field  string
	}{
		{"id with dot", func(e *contract.Envelope) { e.ID = "a.b" }, contract.ErrInvalid, "id"},
		{"source not a URI-reference", func(e *contract.Envelope) { e.Source = "Sh op" }, contract.ErrInvalid, "source"},
		{"type", func(e *contract.Envelope) { e.Type = "a..b" }, contract.ErrInvalid, "type"},
		{"data too large", func(e *contract.Envelope) {
			e.Data = json.RawMessage(`"` + strings.Repeat("x", contract.MaxDataBytes) + `"`)
		}, contract.ErrTooLarge, "data"},
		{"data truncated", func(e *contract.Envelope) { e.Data = json.RawMessage(`{"a":`) }, contract.ErrInvalid, "data"},
		{"data blank", func(e *contract.Envelope) { e.Data = json.RawMessage(`  `) }, contract.ErrInvalid, "data"},
	}
	for _, tc := range tests {
		env := base
		tc.mutate(&env)
		msg, err := contract.NewEventMsg("ingest.shop", env)
		require.Nil(t, msg, tc.name)
		requireFieldErr(t, err, tc.target, tc.field)
	}
}

func TestRunMsgRoundTrip(t *testing.T) {
	t.Parallel()
	req := contract.RunRequestedData{RunID: "r1", Workflow: "billing", TriggerID: "t1", TriggerVersion: 3, DeliveryID: "d1", EventID: "e1", Event: json.RawMessage(`{"id":"e1"}`)}
	msg, err := contract.NewRunMsg("retryd/triggers", contract.RunRequested, req, now)
	require.NoError(t, err)
	require.Equal(t, "runs.billing.requested.r1", msg.Subject)
	require.Equal(t, "run-requested:r1", msg.Header.Get(contract.HeaderMsgID))
	env, got, err := contract.DecodeRunRequested(msg.Subject, msg.Data)
	require.NoError(t, err)
	require.Equal(t, req, got)
	require.Equal(t, "run.requested", env.Type)
	require.Equal(t, "run-requested:r1", env.ID)
	require.Equal(t, now, env.Time)

	for _, ev := range []string{contract.RunCompleted, contract.RunFailed} {
		fin := contract.RunFinishedData{RunID: "r1", Workflow: "billing"}
		if ev == contract.RunFailed {
			fin.Error = &contract.ErrorInfo{Class: "timeout", Message: "step 3 timed out"}
		}
		msg, err := contract.NewRunMsg("worker", ev, fin, now)
		require.NoError(t, err)
		require.Equal(t, "runs.billing."+ev+".r1", msg.Subject)
		require.Equal(t, "run-"+ev+":r1", msg.Header.Get(contract.HeaderMsgID))
		env, got, err := contract.DecodeRunFinished(msg.Subject, msg.Data)
		require.NoError(t, err)
		require.Equal(t, fin, got)
		require.Equal(t, "run."+ev, env.Type)

		// A finished run is not a request, and the other way round.
		// (Strict decoding meets the failed run's error field first.)
		_, _, err = contract.DecodeRunRequested(msg.Subject, msg.Data)
		want := "subject event"
		if ev == contract.RunFailed {
			want = `unknown field "error"`
		}
		requireFieldErr(t, err, contract.ErrInvalid, want)
	}
	_, _, err = contract.DecodeRunFinished(msg.Subject, msg.Data)
	requireFieldErr(t, err, contract.ErrInvalid, `unknown field "trigger_id"`)
}

func TestRunHeartbeatRoundTrip(t *testing.T) {
	t.Parallel()
	hb := contract.RunHeartbeatData{RunID: "r1", Workflow: "billing"}
	msg, err := contract.NewRunMsg("worker", contract.RunHeartbeat, hb, now)
	require.NoError(t, err)
	require.Equal(t, "runs.billing.heartbeat.r1", msg.Subject)
	require.Equal(t, contract.RunHeartbeatMsgID("r1", now), msg.Header.Get(contract.HeaderMsgID))
	next, err := contract.NewRunMsg("worker", contract.RunHeartbeat, hb, now.Add(time.Second))
	require.NoError(t, err)
	require.NotEqual(t, msg.Header.Get(contract.HeaderMsgID), next.Header.Get(contract.HeaderMsgID),
		"each heartbeat has its own id, or the duplicate window drops the later ones")
	env, got, err := contract.DecodeRunHeartbeat(msg.Subject, msg.Data)
	require.NoError(t, err)
	require.Equal(t, hb, got)
	require.Equal(t, "run.heartbeat", env.Type)

	// A heartbeat is not an end, and an end is not a heartbeat.
	_, _, err = contract.DecodeRunFinished(msg.Subject, msg.Data)
	requireFieldErr(t, err, contract.ErrInvalid, "subject event")
	_, _, err = contract.DecodeRunHeartbeat(contract.RunSubject("billing", contract.RunCompleted, "r1"), msg.Data)
	requireFieldErr(t, err, contract.ErrInvalid, "subject event")
	_, _, err = contract.DecodeRunHeartbeat(contract.RunSubject("billing", contract.RunHeartbeat, "r2"), msg.Data)
	requireFieldErr(t, err, contract.ErrInvalid, "does not match subject")
	_, err = contract.NewRunMsg("worker", contract.RunCompleted, hb, now)
	requireFieldErr(t, err, contract.ErrInvalid, "event")
}

func TestNewRunMsgRefuses(t *testing.T) {
	t.Parallel()
	req := contract.RunRequestedData{RunID: "r1", Workflow: "billing", TriggerID: "t1", DeliveryID: "d1", EventID: "e1"}
	_, err := contract.NewRunMsg("s", contract.RunCompleted, req, now)
	requireFieldErr(t, err, contract.ErrInvalid, "event")
	_, err = contract.NewRunMsg("s", contract.RunRequested, contract.RunFinishedData{RunID: "r", Workflow: "w"}, now)
	requireFieldErr(t, err, contract.ErrInvalid, "event")
	_, err = contract.NewRunMsg("s", contract.RunRequested, contract.JobData{}, now)
	requireFieldErr(t, err, contract.ErrInvalid, "is not run data")
	bad := req
	bad.DeliveryID = "d 1"
	_, err = contract.NewRunMsg("s", contract.RunRequested, bad, now)
	requireFieldErr(t, err, contract.ErrInvalid, "data.delivery_id")
	bad = req
	bad.Workflow = "Billing"
	_, err = contract.NewRunMsg("s", contract.RunRequested, bad, now)
	requireFieldErr(t, err, contract.ErrInvalid, "data.workflow")
	_, err = contract.NewRunMsg("s", contract.RunFailed, contract.RunFinishedData{RunID: "r", Workflow: "w", Error: &contract.ErrorInfo{Class: "A B"}}, now)
	requireFieldErr(t, err, contract.ErrInvalid, "data.error.class")
}

func TestJobMsgRoundTrip(t *testing.T) {
	t.Parallel()
	for _, attempt := range []int{1, 4} {
		d := contract.JobData{ID: "j1", JobType: "send_email", Attempt: attempt, Payload: json.RawMessage(`{"to":"x"}`),
			MaxRetries: new(3), RetryEnabled: new(false), TimeoutMS: 30_000, Metadata: map[string]string{"k": "v"}}
		if attempt > 1 {
			d.Checkpoint = json.RawMessage(`{"node":"n2"}`)
		}
		msg, err := contract.NewJobMsg("retryd/worker", d, now)
		require.NoError(t, err)
		require.Equal(t, "jobs.send_email", msg.Subject)
		require.Equal(t, contract.JobMsgID("j1", attempt), msg.Header.Get(contract.HeaderMsgID))
		require.Equal(t, "job", msg.Header.Get(contract.HeaderKind))
		require.Equal(t, "j1", msg.Header.Get(contract.HeaderItemID))
		env, got, err := contract.DecodeJob(msg.Subject, msg.Data)
		require.NoError(t, err)
		require.Equal(t, d, got)
		require.Equal(t, "job.requested", env.Type)
	}
	// A retry's job message has the due's id: a due routed twice runs once.
	msg, err := contract.NewJobMsg("r", contract.JobData{ID: "j1", JobType: "x", Attempt: 3}, now)
	require.NoError(t, err)
	require.Equal(t, contract.DueMsgID(contract.KindJob, "j1", 3), msg.Header.Get(contract.HeaderMsgID))
}

func TestNewJobMsgRefuses(t *testing.T) {
	t.Parallel()
	for _, tc := range []struct {
		d      contract.JobData
		target error
		field  string
	}{
		{contract.JobData{JobType: "x", Attempt: 1}, contract.ErrInvalid, "data.id"},
		{contract.JobData{ID: "j", JobType: "X", Attempt: 1}, contract.ErrInvalid, "data.job_type"},
		{contract.JobData{ID: "j", JobType: "x"}, contract.ErrInvalid, "data.attempt"},
		{contract.JobData{ID: "j", JobType: "x", Attempt: 1, MaxRetries: new(1001)}, contract.ErrInvalid, "data.max_retries"},
		{contract.JobData{ID: "j", JobType: "x", Attempt: 1, TimeoutMS: -1}, contract.ErrInvalid, "data.timeout_ms"},
		{contract.JobData{ID: "j", JobType: "x", Attempt: 1, TimeoutMS: 25 * 3600 * 1000}, contract.ErrInvalid, "data.timeout_ms"},
		{contract.JobData{ID: "j", JobType: "x", Attempt: 1, Payload: json.RawMessage(`{"a":1}x`)}, contract.ErrInvalid, "data.payload"},
		{contract.JobData{ID: "j", JobType: "x", Attempt: 1, Checkpoint: json.RawMessage(strings.Repeat("[", 33) + strings.Repeat("]", 33))}, contract.ErrInvalid, "data.checkpoint"},
		{contract.JobData{ID: "j", JobType: "x", Attempt: 1, Metadata: map[string]string{"k": strings.Repeat("v", 1025)}}, contract.ErrInvalid, "data.metadata"},
	} {
		msg, err := contract.NewJobMsg("s", tc.d, now)
		require.Nil(t, msg)
		requireFieldErr(t, err, tc.target, tc.field)
	}
}
