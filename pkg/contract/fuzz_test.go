package contract_test

import (
	"encoding/json"
	"errors"
	"strings"
	"testing"

	"github.com/nats-io/nats.go"

	"github.com/retryd/retryd/pkg/contract"
	"github.com/retryd/retryd/pkg/contract/contracttest"
)

func mustJSON(t *testing.T, v any) string {
	t.Helper()
	b, err := json.Marshal(v)
	if err != nil {
		t.Fatalf("marshal %T: %v", v, err)
	}
	return string(b)
}

// rebuildErr accepts only the one legitimate reason a decoded value cannot
// be built again: headers push an envelope that was just under the limit
// over it.
func rebuildErr(t *testing.T, err error) {
	t.Helper()
	if err != nil && !errors.Is(err, contract.ErrTooLarge) {
		t.Fatalf("decoded value does not build again: %v", err)
	}
}

// decodesAgain checks what a fuzz target accepted: msg, built again from
// it (err is the build's), decodes to the same value as want. A value
// that does not build again passes only for rebuildErr's reason.
func decodesAgain[T any](t *testing.T, what string, want T, msg *nats.Msg, err error, decode func(subject string, body []byte) (T, error)) {
	t.Helper()
	rebuildErr(t, err)
	if err != nil {
		return
	}
	got, err := decode(msg.Subject, msg.Data)
	if err != nil {
		t.Fatalf("rebuilt %s does not decode: %v", what, err)
	}
	if mustJSON(t, got) != mustJSON(t, want) {
		t.Fatalf("round trip changed the %s:\n%s\n%s", what, mustJSON(t, want), mustJSON(t, got))
	}
}

func lifecycleSeeds(f *testing.F) {
	for ev, data := range lifecycleSamples() {
		msg, err := newLifecycle(ev, data)
		if err != nil {
			f.Fatal(err)
		}
		f.Add(msg.Subject, msg.Data)
	}
	f.Add("retry.event.failed.a", []byte(`{}`))
	f.Add("retry.event.failed.a", []byte(`{"specversion":"1.0","id":"x","source":"s","type":"retry.failed","time":"2025-01-01T00:00:00Z","data":{"kind":"event","id":"a","attempt":1,"retry_after":"9999-12-31T23:00:00-05:00"}}`))
	f.Add("retry.event.due.a", []byte(`{"specversion":"1.0","id":"x","source":"s","type":"retry.due","time":"2025-01-01T00:00:00Z","data":{"kind":"event","id":"a","attempt":1e400}}`))
	f.Add("retry.event.held.a", []byte(`{"specversion":"1.0","id":"x","source":"s","type":"retry.held","time":"2025-01-01T00:00:00Z","data":{"kind":"event","id":"a","attempt":1,"reason":"nap","until":"0001-01-01T00:00:00Z"}}`))
	f.Add("retry.event.released.shop", []byte(`{"specversion":"1.0","id":"x","source":"s","type":"retry.released","time":"2025-01-01T00:00:00Z","data":{"kind":"event","hold_key":"shop","reason":"resume"}}`))
	f.Add("retry.*.failed.>", []byte(`[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[]]]]]]]]]]]]]]]]]]]]]]]]]]]]]]]]]]`))
}

func FuzzDecodeLifecycle(f *testing.F) {
	lifecycleSeeds(f)
	f.Fuzz(func(t *testing.T, subject string, body []byte) {
		ev, err := contract.DecodeLifecycle(subject, body)
		if err != nil {
			contracttest.CheckRefusal(t, err)
			return
		}
		parts, err := contract.ParseRetrySubject(subject)
		if err != nil || parts.Kind != ev.Kind || parts.ID != ev.ID || parts.Event != ev.Event {
			t.Fatalf("decoded %s/%s/%s from subject %q (%v)", ev.Kind, ev.Event, ev.ID, subject, err)
		}
		data, set := lifecycleData(ev)
		if set != 1 {
			t.Fatalf("%d data fields set", set)
		}
		// What decodes builds again, and decodes to the same data.
		msg, err := newLifecycle(ev.Event, data)
		rebuildErr(t, err)
		if err != nil {
			return
		}
		again, err := contract.DecodeLifecycle(msg.Subject, msg.Data)
		if err != nil {
			t.Fatalf("rebuilt message does not decode: %v", err)
		}
		if msg.Subject != subject || again.Attempt() != ev.Attempt() {
			t.Fatalf("rebuilt %s attempt %d, decoded %s attempt %d", msg.Subject, again.Attempt(), subject, ev.Attempt())
		}
		if a, b := mustJSON(t, ev), mustJSON(t, again); strings.Replace(a, mustJSON(t, ev.Envelope), "", 1) != strings.Replace(b, mustJSON(t, again.Envelope), "", 1) {
			t.Fatalf("round trip changed the data:\n%s\n%s", a, b)
		}
	})
}

func FuzzDecodeProducerEvent(f *testing.F) {
	f.Add([]byte(`{"source":"shop","type":"invoice.paid","data":{"amount":12}}`))
	f.Add([]byte(`{"specversion":"1.0","id":"evt-1","source":"shop","type":"invoice.paid","time":"2025-01-01T00:00:00+02:00","subject":"inv/42","datacontenttype":"application/json","data":[1,2]}`))
	f.Add([]byte(`{"source":"shop","type":"a","time":"9999-12-31T23:00:00-05:00"}`))
	f.Add([]byte(`{"source":"shop","type":"a","time":"0001-01-01T00:00:00Z"}`))
	f.Add([]byte(`{"source":"Shop","type":"a..b","id":"a.b"}`))
	f.Add([]byte(`{"source":"shop","type":"a","data":` + strings.Repeat("[", 40) + strings.Repeat("]", 40) + `}`))
	f.Fuzz(func(t *testing.T, b []byte) {
		ev, err := contract.DecodeProducerEvent(b)
		if err != nil {
			contracttest.CheckRefusal(t, err)
			return
		}
		// An accepted event goes through ingress: completed, published,
		// decoded from the stream.
		env := ev.Envelope("01JFUZZ", now)
		msg, err := contract.NewEventMsg(contract.IngestSubject(env.Source), env)
		decodesAgain(t, "event", env, msg, err, func(_ string, body []byte) (contract.Envelope, error) {
			return contract.DecodeEventMsg(body)
		})
	})
}

func FuzzDecodeJob(f *testing.F) {
	for _, d := range []contract.JobData{
		{ID: "j1", JobType: "email", Attempt: 1},
		{ID: "j1", JobType: "email", Attempt: 3, Payload: json.RawMessage(`{"a":1}`), Checkpoint: json.RawMessage(`{"n":2}`), MaxRetries: new(2), RetryEnabled: new(true), TimeoutMS: 100, Metadata: map[string]string{"k": "v"}},
		{ID: "j2", JobType: "email", Attempt: 1, Priority: contract.PriorityHigh},
		{ID: "j3", JobType: "email", Attempt: 2, Priority: contract.PriorityLow},
	} {
		msg, err := contract.NewJobMsg("w", d, now)
		if err != nil {
			f.Fatal(err)
		}
		f.Add(msg.Subject, msg.Data)
	}
	f.Add("jobs.*", []byte(`{}`))
	f.Fuzz(func(t *testing.T, subject string, body []byte) {
		env, d, err := contract.DecodeJob(subject, body)
		if err != nil {
			contracttest.CheckRefusal(t, err)
			return
		}
		if subject != contract.JobSubjectFor(d.JobType, d.Priority) {
			t.Fatalf("job type %q decoded from subject %q", d.JobType, subject)
		}
		msg, err := contract.NewJobMsg(env.Source, d, now)
		decodesAgain(t, "job", d, msg, err, func(subject string, body []byte) (contract.JobData, error) {
			_, again, err := contract.DecodeJob(subject, body)
			return again, err
		})
	})
}

func FuzzDecodeRunRequested(f *testing.F) {
	msg, err := contract.NewRunMsg("t", contract.RunRequested, contract.RunRequestedData{RunID: "r1", Workflow: "billing", TriggerID: "t1", TriggerVersion: 2, DeliveryID: "d1", EventID: "e1", Event: json.RawMessage(`{"id":"e1"}`)}, now)
	if err != nil {
		f.Fatal(err)
	}
	f.Add(msg.Subject, msg.Data)
	f.Add("runs.billing.requested.r1", []byte(`{"specversion":"1.0"}`))
	f.Fuzz(func(t *testing.T, subject string, body []byte) {
		env, d, err := contract.DecodeRunRequested(subject, body)
		if err != nil {
			contracttest.CheckRefusal(t, err)
			return
		}
		if subject != contract.RunSubject(d.Workflow, contract.RunRequested, d.RunID) {
			t.Fatalf("run %s/%s decoded from subject %q", d.Workflow, d.RunID, subject)
		}
		msg, err := contract.NewRunMsg(env.Source, contract.RunRequested, d, now)
		decodesAgain(t, "run", d, msg, err, func(subject string, body []byte) (contract.RunRequestedData, error) {
			_, again, err := contract.DecodeRunRequested(subject, body)
			return again, err
		})
	})
}

func FuzzParseRetrySubject(f *testing.F) {
	for _, s := range []string{"retry.event.failed.01J", "retry.event-trigger.due.d_1", "retry.*.failed.>", "retry.event.failed.a.b", "retry.event.failed.a.3", "retry.event.failed.a.03", "retry..due.", "retry.job.due.a b"} {
		f.Add(s)
	}
	f.Fuzz(func(t *testing.T, s string) {
		p, err := contract.ParseRetrySubject(s)
		if err != nil {
			contracttest.CheckRefusal(t, err)
			return
		}
		got := contract.RetrySubject(p.Kind, p.Event, p.ID)
		if p.Shard != "" {
			got += "." + p.Shard
		}
		if got != s {
			t.Fatalf("parsed %q, builds %q", s, got)
		}
		for _, tok := range []string{"*", ">", " ", "\t", "\n", "\r"} {
			if strings.Contains(p.Kind+p.ID, tok) {
				t.Fatalf("%q accepted with %q in a token", s, tok)
			}
		}
	})
}

func FuzzParseDueMsgID(f *testing.F) {
	for _, s := range []string{"event-retry:01J:3", "event-trigger-retry:d1:2", "job-retry:j:1000000", "event-retry:a:+3", "event-retry:a:03", "x-retry-retry:a:1", "-retry:a:1", "event-retry:a.b:1"} {
		f.Add(s)
	}
	f.Fuzz(func(t *testing.T, s string) {
		kind, id, attempt, err := contract.ParseDueMsgID(s)
		if err != nil {
			contracttest.CheckRefusal(t, err)
			return
		}
		if got := contract.DueMsgID(kind, id, attempt); got != s {
			t.Fatalf("parsed %q, builds %q", s, got)
		}
		if err := contract.ValidateAttempt("attempt", attempt); err != nil {
			t.Fatal(err)
		}
	})
}

func FuzzRetryAfter(f *testing.F) {
	for _, s := range []string{`30`, `0.3`, `1e2`, `"120"`, `"2025-03-14T16:00:00Z"`, `"9999-12-31T23:00:00-05:00"`, `"0000-01-01T00:00:00+01:00"`, `-1`, `"0x1p-2"`, `"Inf"`, `1e400`, `0.000000015`} {
		f.Add([]byte(s))
	}
	f.Fuzz(func(t *testing.T, b []byte) {
		var r contract.RetryAfter
		if err := json.Unmarshal(b, &r); err != nil {
			return
		}
		if r.After < 0 || r.After > contract.MaxRetryAfter {
			t.Fatalf("%s decoded to %s", b, r.After)
		}
		if d := r.Delay(now); d < 0 {
			t.Fatalf("negative delay %s", d)
		}
		out, err := json.Marshal(r)
		if err != nil {
			t.Fatalf("%s decoded to %+v which does not encode: %v", b, r, err)
		}
		var again contract.RetryAfter
		if err := json.Unmarshal(out, &again); err != nil {
			t.Fatalf("%s encoded as %s which does not decode: %v", b, out, err)
		}
		if !again.At.Equal(r.At) || again.After != r.After {
			t.Fatalf("%s -> %+v -> %s -> %+v", b, r, out, again)
		}
	})
}
