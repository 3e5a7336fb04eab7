package contract_test

import (
	"bytes"
	"encoding/json"
	"strings"
	"testing"

	"github.com/stretchr/testify/require"

	"github.com/retryd/retryd/pkg/contract"
)

// decoder is one strict decoder of the contract with a valid input to
// mutate.
type decoder struct {
	name    string
	root    string // the field name errors about the whole input use
	subject string
	body    []byte
	decode  func(subject string, body []byte) error
	// typed decoders require data and decode it strictly.
	typed bool
}

// badCase is one malformed input: a subject and body, the error it must
// wrap and a word its message must contain (the field).
type badCase struct {
	name    string
	subject string
	body    []byte
	target  error
	field   string
}

func decoders(t *testing.T) []decoder {
	t.Helper()
	failed, err := contract.NewLifecycleMsg("retryd/test", contract.Failed, lifecycleSamples()[contract.Failed].(contract.FailedData), now)
	require.NoError(t, err)
	job, err := contract.NewJobMsg("retryd/test", contract.JobData{ID: "j1", JobType: "email", Attempt: 2, Payload: json.RawMessage(`{"a":1}`)}, now)
	require.NoError(t, err)
	req, err := contract.NewRunMsg("retryd/test", contract.RunRequested, contract.RunRequestedData{RunID: "r1", Workflow: "billing", TriggerID: "t1", DeliveryID: "d1", EventID: "e1"}, now)
	require.NoError(t, err)
	fin, err := contract.NewRunMsg("retryd/test", contract.RunFailed, contract.RunFinishedData{RunID: "r1", Workflow: "billing", Error: &contract.ErrorInfo{Message: "x"}}, now)
	require.NoError(t, err)
	hb, err := contract.NewRunMsg("retryd/test", contract.RunHeartbeat, contract.RunHeartbeatData{RunID: "r1", Workflow: "billing"}, now)
	require.NoError(t, err)
	evt, err := contract.NewEventMsg("ingest.shop", contract.Envelope{SpecVersion: "1.0", ID: "e1", Source: "shop", Type: "invoice.paid", Time: now, Data: json.RawMessage(`{"n":1}`)})
	require.NoError(t, err)

	return []decoder{
		{name: "DecodeLifecycle", root: "envelope", subject: failed.Subject, body: failed.Data, typed: true,
			decode: func(s string, b []byte) error { _, err := contract.DecodeLifecycle(s, b); return err }},
		{name: "DecodeJob", root: "envelope", subject: job.Subject, body: job.Data, typed: true,
			decode: func(s string, b []byte) error { _, _, err := contract.DecodeJob(s, b); return err }},
		{name: "DecodeRunRequested", root: "envelope", subject: req.Subject, body: req.Data, typed: true,
			decode: func(s string, b []byte) error { _, _, err := contract.DecodeRunRequested(s, b); return err }},
		{name: "DecodeRunFinished", root: "envelope", subject: fin.Subject, body: fin.Data, typed: true,
			decode: func(s string, b []byte) error { _, _, err := contract.DecodeRunFinished(s, b); return err }},
		{name: "DecodeRunHeartbeat", root: "envelope", subject: hb.Subject, body: hb.Data, typed: true,
			decode: func(s string, b []byte) error { _, _, err := contract.DecodeRunHeartbeat(s, b); return err }},
		{name: "DecodeEventMsg", root: "envelope", subject: evt.Subject, body: evt.Data,
			decode: func(_ string, b []byte) error { _, err := contract.DecodeEventMsg(b); return err }},
		{name: "DecodeEnvelope", root: "envelope", subject: evt.Subject, body: evt.Data,
			decode: func(_ string, b []byte) error { _, err := contract.DecodeEnvelope(b); return err }},
		{name: "DecodeProducerEvent", root: "event", body: []byte(`{"source":"shop","type":"invoice.paid","data":{"n":1}}`),
			decode: func(_ string, b []byte) error { _, err := contract.DecodeProducerEvent(b); return err }},
	}
}

// mutate decodes body into a map, lets fn change it and encodes it again.
func mutate(t *testing.T, body []byte, fn func(m map[string]any)) []byte {
	t.Helper()
	var m map[string]any
	dec := json.NewDecoder(bytes.NewReader(body))
	dec.UseNumber()
	require.NoError(t, dec.Decode(&m))
	fn(m)
	out, err := json.Marshal(m)
	require.NoError(t, err)
	return out
}

func dataOf(m map[string]any) map[string]any { return m["data"].(map[string]any) }

// genericCases apply to every decoder.
func genericCases(t *testing.T, d decoder) []badCase {
	t.Helper()
	deep := json.RawMessage(strings.Repeat("[", 10_000) + strings.Repeat("]", 10_000))
	c := func(name string, body []byte, target error, field string) badCase {
		return badCase{name: name, subject: d.subject, body: body, target: target, field: field}
	}
	cases := []badCase{
		c("empty", nil, contract.ErrInvalid, d.root+" is empty"),
		c("blank", []byte(" \n\t"), contract.ErrInvalid, d.root+" is empty"),
		c("truncated", d.body[:len(d.body)/2], contract.ErrInvalid, d.root),
		c("truncated at end", d.body[:len(d.body)-1], contract.ErrInvalid, "truncated"),
		c("not an object", []byte(`[1,2]`), contract.ErrInvalid, d.root),
		c("a string", []byte(`"hello"`), contract.ErrInvalid, d.root),
		c("trailing data", append(append([]byte{}, d.body...), []byte(` {"x":1}`)...), contract.ErrInvalid, "data after the JSON value"),
		c("trailing garbage", append(append([]byte{}, d.body...), 'x'), contract.ErrInvalid, d.root),
		c("invalid utf8", bytes.Replace(d.body, []byte(`"source":"`), []byte("\"source\":\"\xff"), 1), contract.ErrInvalid, "UTF-8"),
		c("oversized", append(append([]byte{}, d.body...), bytes.Repeat([]byte(" "), contract.MaxEnvelopeBytes)...), contract.ErrTooLarge, d.root),
		c("oversized data", mutate(t, d.body, func(m map[string]any) { m["data"] = strings.Repeat("x", contract.MaxEnvelopeBytes) }), contract.ErrTooLarge, d.root),
		c("10000-deep nesting", mutate(t, d.body, func(m map[string]any) { m["data"] = deep }), contract.ErrInvalid, "nested deeper than 32"),
		c("33-deep nesting", mutate(t, d.body, func(m map[string]any) {
			m["data"] = json.RawMessage(strings.Repeat(`{"a":`, 32) + "1" + strings.Repeat("}", 32))
		}), contract.ErrInvalid, "nested deeper than 32"),
		// Not a field, and not an extension attribute's name either (those
		// are lowercase letters and digits): every decoder refuses it.
		c("unknown field", mutate(t, d.body, func(m map[string]any) { m["spec_version"] = "1.0" }), contract.ErrInvalid, `spec_version`),
		c("wrong type source", mutate(t, d.body, func(m map[string]any) { m["source"] = 5 }), contract.ErrInvalid, `"source"`),
		c("wrong type type", mutate(t, d.body, func(m map[string]any) { m["type"] = []string{"a"} }), contract.ErrInvalid, `"type"`),
		c("missing source", mutate(t, d.body, func(m map[string]any) { delete(m, "source") }), contract.ErrInvalid, "source"),
		c("missing type", mutate(t, d.body, func(m map[string]any) { delete(m, "type") }), contract.ErrInvalid, "type"),
		c("wrong specversion", mutate(t, d.body, func(m map[string]any) { m["specversion"] = "0.3" }), contract.ErrInvalid, "specversion"),
		c("huge number", mutate(t, d.body, func(m map[string]any) { m["specversion"] = json.RawMessage(`1e400`) }), contract.ErrInvalid, "specversion"),
		c("null", []byte(`null`), contract.ErrInvalid, map[bool]string{true: "source", false: "specversion"}[d.root == "event"]),
	}
	if d.root == "envelope" {
		cases = append(cases,
			c("missing specversion", mutate(t, d.body, func(m map[string]any) { delete(m, "specversion") }), contract.ErrInvalid, "specversion"),
			c("missing id", mutate(t, d.body, func(m map[string]any) { delete(m, "id") }), contract.ErrInvalid, "id is required"),
			c("missing time", mutate(t, d.body, func(m map[string]any) { delete(m, "time") }), contract.ErrInvalid, "time is required"),
			c("wrong type time", mutate(t, d.body, func(m map[string]any) { m["time"] = 1700000000 }), contract.ErrInvalid, `"time"`),
			c("bad time", mutate(t, d.body, func(m map[string]any) { m["time"] = "yesterday" }), contract.ErrInvalid, "yesterday"),
			c("wrong type id", mutate(t, d.body, func(m map[string]any) { m["id"] = 12 }), contract.ErrInvalid, `"id"`),
		)
	}
	if d.typed {
		cases = append(cases,
			c("missing data", mutate(t, d.body, func(m map[string]any) { delete(m, "data") }), contract.ErrInvalid, "data is required"),
			c("data not an object", mutate(t, d.body, func(m map[string]any) { m["data"] = "x" }), contract.ErrInvalid, "data"),
			c("data null", mutate(t, d.body, func(m map[string]any) { m["data"] = nil }), contract.ErrInvalid, "data"),
			c("data unknown field", mutate(t, d.body, func(m map[string]any) { dataOf(m)["bogus"] = 1 }), contract.ErrInvalid, `"bogus"`),
			c("data nested unknown field", mutate(t, d.body, func(m map[string]any) { dataOf(m)["error"] = map[string]any{"message": "x", "stack": "y"} }), contract.ErrInvalid, "data"),
		)
	}
	return cases
}

// idCases put ids that are not subject-safe into a data field.
func idCases(t *testing.T, d decoder, field string) []badCase {
	t.Helper()
	var cases []badCase
	for _, id := range []string{"a.b", "a*", ">", "a b", " ", "", "é", strings.Repeat("x", 129)} {
		cases = append(cases, badCase{
			name: "data." + field + "=" + id, subject: d.subject, target: contract.ErrInvalid, field: "data." + field,
			body: mutate(t, d.body, func(m map[string]any) { dataOf(m)[field] = id }),
		})
	}
	return cases
}

func specificCases(t *testing.T, d decoder) []badCase {
	t.Helper()
	c := func(name, subject string, body []byte, target error, field string) badCase {
		return badCase{name: name, subject: subject, body: body, target: target, field: field}
	}
	set := func(field string, v any) []byte {
		return mutate(t, d.body, func(m map[string]any) { dataOf(m)[field] = v })
	}
	switch d.name {
	case "DecodeLifecycle":
		cases := append(idCases(t, d, "id"),
			c("attempt as string", d.subject, set("attempt", "2"), contract.ErrInvalid, `"attempt"`),
			c("attempt huge", d.subject, set("attempt", json.RawMessage(`1e400`)), contract.ErrInvalid, `"attempt"`),
			c("attempt overflow", d.subject, set("attempt", json.RawMessage(`99999999999999999999999`)), contract.ErrInvalid, `"attempt"`),
			c("attempt fraction", d.subject, set("attempt", json.RawMessage(`1.5`)), contract.ErrInvalid, `"attempt"`),
			c("attempt zero", d.subject, set("attempt", 0), contract.ErrInvalid, "data.attempt"),
			c("attempt negative", d.subject, set("attempt", -3), contract.ErrInvalid, "data.attempt"),
			c("missing kind", d.subject, mutate(t, d.body, func(m map[string]any) { delete(dataOf(m), "kind") }), contract.ErrInvalid, "data.kind"),
			c("missing id", d.subject, mutate(t, d.body, func(m map[string]any) { delete(dataOf(m), "id") }), contract.ErrInvalid, "data.id"),
			c("missing attempt", d.subject, mutate(t, d.body, func(m map[string]any) { delete(dataOf(m), "attempt") }), contract.ErrInvalid, "data.attempt"),
			c("kind with dot", d.subject, set("kind", "jo.b"), contract.ErrInvalid, "data.kind"),
			c("retry_after negative", d.subject, set("retry_after", -1), contract.ErrInvalid, "retry_after"),
			c("retry_after words", d.subject, set("retry_after", "soon"), contract.ErrInvalid, "retry_after"),
			c("retry_after too far", d.subject, set("retry_after", 1e12), contract.ErrInvalid, "retry_after"),
			c("error as string", d.subject, set("error", "boom"), contract.ErrInvalid, `"error"`),
			c("error message too long", d.subject, set("error", map[string]any{"message": strings.Repeat("m", 4097)}), contract.ErrInvalid, "data.error.message"),
			c("payload too large", d.subject, set("payload", strings.Repeat("p", contract.MaxDataBytes)), contract.ErrTooLarge, "data.payload"),
			c("max_retries huge", d.subject, set("max_retries", json.RawMessage(`1e30`)), contract.ErrInvalid, `"max_retries"`),
			c("metadata wrong type", d.subject, set("metadata", map[string]any{"k": 1}), contract.ErrInvalid, "metadata"),
			c("subject id differs", contract.RetrySubject("job", contract.Failed, "other"), d.body, contract.ErrInvalid, "does not match subject"),
			c("subject kind differs", contract.RetrySubject("event", contract.Failed, "01JQ7Z3K5W"), d.body, contract.ErrInvalid, "does not match subject"),
			c("subject event differs", contract.RetrySubject("job", contract.Succeeded, "01JQ7Z3K5W"), d.body, contract.ErrInvalid, "type"),
			c("type differs", d.subject, mutate(t, d.body, func(m map[string]any) { m["type"] = "retry.due" }), contract.ErrInvalid, "type"),
			c("subject id dot", "retry.job.failed.01JQ.7Z3K5W", d.body, contract.ErrInvalid, "subject"),
			c("subject id star", "retry.job.failed.*", d.body, contract.ErrInvalid, "subject id"),
			c("subject id gt", "retry.job.failed.>", d.body, contract.ErrInvalid, "subject id"),
			c("subject id space", "retry.job.failed.01J 7", d.body, contract.ErrInvalid, "subject id"),
			c("subject other stream", "jobs.email", d.body, contract.ErrInvalid, "subject"),
		)
		// A due with a failed's data: strict decoding refuses error, retry_after...
		due := mutate(t, d.body, func(m map[string]any) { m["type"] = "retry.due" })
		cases = append(cases, c("failed data on due subject", contract.RetrySubject("job", contract.Due, "01JQ7Z3K5W"), due, contract.ErrInvalid, "unknown field"))
		return cases
	case "DecodeJob":
		return append(idCases(t, d, "id"),
			c("job type differs", "jobs.other", d.body, contract.ErrInvalid, "data.job_type"),
			c("subject too long", "jobs.email.x", d.body, contract.ErrInvalid, "subject"),
			c("subject star", "jobs.*", d.body, contract.ErrInvalid, "subject job_type"),
			c("attempt huge", d.subject, set("attempt", json.RawMessage(`1e400`)), contract.ErrInvalid, `"attempt"`),
			c("attempt zero", d.subject, set("attempt", 0), contract.ErrInvalid, "data.attempt"),
			c("timeout string", d.subject, set("timeout_ms", "1s"), contract.ErrInvalid, `"timeout_ms"`),
			c("missing job_type", d.subject, mutate(t, d.body, func(m map[string]any) { delete(dataOf(m), "job_type") }), contract.ErrInvalid, "data.job_type"),
			c("retry_enabled string", d.subject, set("retry_enabled", "yes"), contract.ErrInvalid, `"retry_enabled"`),
		)
	case "DecodeRunRequested":
		cases := idCases(t, d, "run_id")
		cases = append(cases, idCases(t, d, "delivery_id")...)
		cases = append(cases, idCases(t, d, "trigger_id")...)
		cases = append(cases, idCases(t, d, "event_id")...)
		return append(cases,
			c("run id differs", contract.RunSubject("billing", contract.RunRequested, "r2"), d.body, contract.ErrInvalid, "does not match subject"),
			c("workflow differs", contract.RunSubject("other", contract.RunRequested, "r1"), d.body, contract.ErrInvalid, "does not match subject"),
			c("completed subject", contract.RunSubject("billing", contract.RunCompleted, "r1"), d.body, contract.ErrInvalid, "subject event"),
			c("subject run id star", "runs.billing.requested.*", d.body, contract.ErrInvalid, "subject run_id"),
			c("trigger_version string", d.subject, set("trigger_version", "3"), contract.ErrInvalid, `"trigger_version"`),
			c("trigger_version huge", d.subject, set("trigger_version", json.RawMessage(`1e400`)), contract.ErrInvalid, `"trigger_version"`),
			c("missing workflow", d.subject, mutate(t, d.body, func(m map[string]any) { delete(dataOf(m), "workflow") }), contract.ErrInvalid, "data"),
		)
	case "DecodeRunFinished":
		return append(idCases(t, d, "run_id"),
			c("requested subject", contract.RunSubject("billing", contract.RunRequested, "r1"), d.body, contract.ErrInvalid, "subject event"),
			c("run id differs", contract.RunSubject("billing", contract.RunFailed, "r2"), d.body, contract.ErrInvalid, "does not match subject"),
			c("bad event", "runs.billing.started.r1", d.body, contract.ErrInvalid, "subject event"),
			c("error wrong type", d.subject, set("error", 5), contract.ErrInvalid, `"error"`),
			c("error class", d.subject, set("error", map[string]any{"class": "Not A Token", "message": "x"}), contract.ErrInvalid, "data.error.class"),
		)
	case "DecodeRunHeartbeat":
		return append(idCases(t, d, "run_id"),
			c("completed subject", contract.RunSubject("billing", contract.RunCompleted, "r1"), d.body, contract.ErrInvalid, "subject event"),
			c("run id differs", contract.RunSubject("billing", contract.RunHeartbeat, "r2"), d.body, contract.ErrInvalid, "does not match subject"),
			c("workflow differs", contract.RunSubject("other", contract.RunHeartbeat, "r1"), d.body, contract.ErrInvalid, "does not match subject"),
			c("unknown field", d.subject, set("lease", "1h"), contract.ErrInvalid, `unknown field "lease"`),
		)
	case "DecodeEventMsg":
		cases := []badCase{}
		for _, id := range []string{"a.b", "a*", ">", "a b"} {
			cases = append(cases, c("id "+id, d.subject, mutate(t, d.body, func(m map[string]any) { m["id"] = id }), contract.ErrInvalid, "id"))
		}
		return append(cases,
			c("source not a URI-reference", d.subject, mutate(t, d.body, func(m map[string]any) { m["source"] = "sh op" }), contract.ErrInvalid, "source"),
			c("type with star", d.subject, mutate(t, d.body, func(m map[string]any) { m["type"] = "invoice.*" }), contract.ErrInvalid, "type"),
			c("data over MaxDataBytes", d.subject, mutate(t, d.body, func(m map[string]any) { m["data"] = strings.Repeat("d", contract.MaxDataBytes) }), contract.ErrTooLarge, "data"),
		)
	case "DecodeProducerEvent":
		cases := []badCase{}
		for _, id := range []string{"a.b", "a*", ">", "a b"} {
			cases = append(cases, c("id "+id, "", mutate(t, d.body, func(m map[string]any) { m["id"] = id }), contract.ErrInvalid, "id"))
		}
		return append(cases,
			c("source not a URI-reference", "", mutate(t, d.body, func(m map[string]any) { m["source"] = "sh op" }), contract.ErrInvalid, "source"),
			c("type spaces", "", mutate(t, d.body, func(m map[string]any) { m["type"] = "invoice paid" }), contract.ErrInvalid, "type"),
			c("datacontenttype", "", mutate(t, d.body, func(m map[string]any) { m["datacontenttype"] = "xyz" }), contract.ErrInvalid, "datacontenttype"),
			c("subject too long", "", mutate(t, d.body, func(m map[string]any) { m["subject"] = strings.Repeat("s", 129) }), contract.ErrInvalid, "subject"),
			c("time wrong", "", mutate(t, d.body, func(m map[string]any) { m["time"] = "2025-13-01T00:00:00Z" }), contract.ErrInvalid, "month out of range"),
			c("data over MaxDataBytes", "", mutate(t, d.body, func(m map[string]any) { m["data"] = strings.Repeat("d", contract.MaxDataBytes) }), contract.ErrTooLarge, "data"),
		)
	}
	return nil
}

func TestBadInputCorpus(t *testing.T) {
	t.Parallel()
	for _, d := range decoders(t) {
		t.Run(d.name, func(t *testing.T) {
			t.Parallel()
			require.NoError(t, d.decode(d.subject, d.body), "the valid input decodes")
			cases := append(genericCases(t, d), specificCases(t, d)...)
			for _, tc := range cases {
				err := d.decode(tc.subject, tc.body)
				if !assertFieldErr(t, err, tc.target, tc.field) {
					t.Errorf("%s/%s: got %v, want %v naming %q", d.name, tc.name, err, tc.target, tc.field)
				}
			}
		})
	}
}

// assertFieldErr is requireFieldErr that reports instead of stopping, so
// one run shows every failing case.
func assertFieldErr(t *testing.T, err error, target error, field string) bool {
	t.Helper()
	if err == nil {
		return false
	}
	var fe *contract.FieldError
	return errorsIs(err, target) && asFieldError(err, &fe) && strings.Contains(err.Error(), field)
}
