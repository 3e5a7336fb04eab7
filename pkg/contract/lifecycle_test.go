package contract_test

import (
	"encoding/json"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/nats-io/nats.go"
	"github.com/stretchr/testify/require"

	"github.com/retryd/retryd/pkg/contract"
)

// lifecycleSamples is one complete, valid data value per lifecycle event.
func lifecycleSamples() map[contract.Lifecycle]any {
	next := now.Add(90 * time.Second)
	retryAfterMS := int64(60_000)
	return map[contract.Lifecycle]any{
		contract.Failed: contract.FailedData{
			Kind: contract.KindJob, ID: "01JQ7Z3K5W", Attempt: 2,
			Error:      contract.ErrorInfo{Class: "rate_limit", Message: "429 Too Many Requests"},
			Reason:     "source_throttled",
			RetryAfter: contract.RetryAfterDuration(60 * time.Second),
			JobType:    "send_email", Source: "shop",
			MaxRetries: new(5), RetryEnabled: new(true),
			Payload:    json.RawMessage(`{"to":"a@example.com"}`),
			Checkpoint: json.RawMessage(`{"last_node":"render"}`),
			Metadata:   map[string]string{"tenant": "t1"},
			Executor:   "Worker-7.example.com-4242",
		},
		contract.Succeeded: contract.SucceededData{Kind: contract.KindJob, ID: "01JQ7Z3K5W", Attempt: 3, Metadata: map[string]string{"took_ms": "12"}, Executor: "worker-7-4242"},
		contract.Scheduled: contract.ScheduledData{
			Kind: contract.KindEvent, ID: "01JQ7Z3K5W", Attempt: 2, NextAttemptAt: next, Source: "shop",
			Decision: contract.Decision{Policy: "event-default", PolicyVersion: 1, DecidedBy: contract.DecidedByRetryAfter, ErrorClass: "rate_limit",
				BaseDelayMS: 1000, JitterMS: 250, DelayMS: 60_000, RetryAfterMS: &retryAfterMS, RetryCount: 0, MaxRetries: 5, Note: "capped"},
		},
		contract.Rescheduled: contract.ScheduledData{
			Kind: contract.KindEventTrigger, ID: "d-1", Attempt: 3, NextAttemptAt: next,
			Decision: contract.Decision{Policy: "trigger-default", PolicyVersion: 2, DecidedBy: contract.DecidedByBackoff, BaseDelayMS: 2000, JitterMS: 10, DelayMS: 2010, RetryCount: 1, MaxRetries: 5},
		},
		contract.Due: contract.DueData{
			Kind: contract.KindJob, ID: "01JQ7Z3K5W", Attempt: 3, NextAttemptAt: next, JobType: "send_email",
			Payload: json.RawMessage(`{"to":"a@example.com"}`), Checkpoint: json.RawMessage(`{"last_node":"render"}`),
			Metadata: map[string]string{"tenant": "t1"},
		},
		contract.Exhausted: contract.ExhaustedData{
			Kind: contract.KindJob, ID: "01JQ7Z3K5W", Attempt: 6, Reason: contract.ExhaustedNonRetryable,
			Error: contract.ErrorInfo{Class: "timeout", Message: "deadline exceeded", NonRetryable: true}, RetryCount: 5, MaxRetries: 5,
			Policy: "job-send_email", PolicyVersion: 3, JobType: "send_email",
		},
		contract.Cancelled: contract.CancelledData{Kind: contract.KindEvent, ID: "01JQ7Z3K5W", Attempt: 0, By: "operator", Reason: "customer asked"},
		contract.Held: contract.HeldData{
			Kind: contract.KindEvent, ID: "01JQ7Z3K5W", Attempt: 3, Reason: contract.HoldPause, Until: &next,
			HoldKey: "shop", Detail: "source is paused", Source: "shop",
			Payload: json.RawMessage(`{"n":1}`), Metadata: map[string]string{"type": "invoice.paid"},
			Executor: "ingress-0-1",
		},
		contract.Released: contract.ReleasedData{Kind: contract.KindEvent, HoldKey: "shop", Reason: contract.ReleaseResume, By: "api", ReleasedAt: now},
	}
}

// sampleMsgID is the Nats-Msg-Id NewLifecycleMsg gives a sample.
func sampleMsgID(ev contract.Lifecycle, data any) string {
	if rd, ok := data.(contract.ReleasedData); ok {
		if rd.ReleaseID != "" {
			return rd.Kind + "-released:" + rd.HoldKey + ":" + rd.ReleaseID
		}
		return contract.ReleasedMsgID(rd.Kind, rd.HoldKey, rd.ReleasedAt)
	}
	kind, id, attempt := itemOf(data)
	return contract.LifecycleMsgID(kind, ev, id, attempt)
}

func TestLifecycleRoundTrip(t *testing.T) {
	t.Parallel()
	for ev, data := range lifecycleSamples() {
		t.Run(string(ev), func(t *testing.T) {
			t.Parallel()
			msg, err := newLifecycle(ev, data)
			require.NoError(t, err)
			kind, id, attempt := itemOf(data)

			require.Equal(t, contract.RetrySubject(kind, ev, id), msg.Subject)
			msgID := sampleMsgID(ev, data)
			require.Equal(t, msgID, msg.Header.Get(contract.HeaderMsgID))
			require.Equal(t, contract.ContentTypeJSON, msg.Header.Get(contract.HeaderContentType))
			require.Equal(t, kind, msg.Header.Get(contract.HeaderKind))
			require.Equal(t, id, msg.Header.Get(contract.HeaderItemID))
			require.Equal(t, strconv.Itoa(attempt), msg.Header.Get(contract.HeaderAttempt))
			require.Equal(t, string(ev), msg.Header.Get(contract.HeaderEvent))

			got, err := contract.DecodeLifecycle(msg.Subject, msg.Data)
			require.NoError(t, err)
			require.Equal(t, ev, got.Event)
			require.Equal(t, kind, got.Kind)
			require.Equal(t, id, got.ID)
			require.Equal(t, attempt, got.Attempt())
			require.Equal(t, contract.Envelope{
				SpecVersion: "1.0", ID: msgID, Source: "retryd/test", Type: "retry." + string(ev), Time: now,
				Subject: kind + "/" + id, DataContentType: "application/json", Data: got.Envelope.Data,
			}, got.Envelope)

			decoded, set := lifecycleData(got)
			require.Equal(t, 1, set, "exactly one data field is set")
			require.Equal(t, data, decoded)

			// The same fact built twice is byte for byte the same message.
			again, err := newLifecycle(ev, data)
			require.NoError(t, err)
			require.Equal(t, msg.Data, again.Data)
		})
	}
}

func TestLifecycleMinimalRoundTrip(t *testing.T) {
	t.Parallel()
	d := contract.FailedData{Kind: "event", ID: "e1", Attempt: 1}
	msg, err := contract.NewLifecycleMsg("ingress", contract.Failed, d, now)
	require.NoError(t, err)
	require.NotContains(t, string(msg.Data), "retry_after")
	require.NotContains(t, string(msg.Data), "payload")
	got, err := contract.DecodeLifecycle(msg.Subject, msg.Data)
	require.NoError(t, err)
	require.Equal(t, d, *got.Failed)

	// Pointers to data work as well as values.
	_, err = contract.NewLifecycleMsg("ingress", contract.Failed, &d, now)
	require.NoError(t, err)
}

// The executor of an attempt is optional: a fact from an owner that does
// not name one (an older worker) decodes with none, the longest one fits,
// and the decoder refuses one the builder would have refused.
func TestExecutorOnTheWire(t *testing.T) {
	t.Parallel()
	longest := strings.Repeat("é", contract.MaxTokenLen/2) // 64 bytes, 32 runes
	msg, err := contract.NewLifecycleMsg("retryd/worker", contract.Failed,
		contract.FailedData{Kind: "job", ID: "j1", Attempt: 1, Executor: longest}, now)
	require.NoError(t, err)
	require.Contains(t, string(msg.Data), `"executor":"`+longest+`"`)
	got, err := contract.DecodeLifecycle(msg.Subject, msg.Data)
	require.NoError(t, err)
	require.Equal(t, longest, got.Failed.Executor)

	old, err := contract.NewLifecycleMsg("retryd/worker", contract.Succeeded,
		contract.SucceededData{Kind: "job", ID: "j1", Attempt: 1}, now)
	require.NoError(t, err)
	require.NotContains(t, string(old.Data), "executor", "absent, not empty: older schedulers refuse the field")
	got, err = contract.DecodeLifecycle(old.Subject, old.Data)
	require.NoError(t, err)
	require.Empty(t, got.Succeeded.Executor)

	forged := strings.Replace(string(msg.Data), longest, "a\\u0007b", 1)
	_, err = contract.DecodeLifecycle(msg.Subject, []byte(forged))
	requireFieldErr(t, err, contract.ErrInvalid, "data.executor")
	tooLong := strings.Replace(string(msg.Data), longest, longest+"x", 1)
	_, err = contract.DecodeLifecycle(msg.Subject, []byte(tooLong))
	requireFieldErr(t, err, contract.ErrInvalid, "data.executor")

	require.NoError(t, contract.ValidateExecutor("executor", ""), "empty is unknown")
	require.NoError(t, contract.ValidateExecutor("executor", "MacBook-Pro.local-981"))
}

func TestNewLifecycleMsgRefuses(t *testing.T) {
	t.Parallel()
	valid := contract.FailedData{Kind: "event", ID: "e1", Attempt: 1}
	big := json.RawMessage(`"` + strings.Repeat("x", contract.MaxDataBytes-2) + `"`)
	tests := []struct {
		name   string
		ev     contract.Lifecycle
		data   any
		target error
		field  string
	}{
		{"unknown event", "retried", valid, contract.ErrInvalid, "event"},
		{"data of another event", contract.Due, valid, contract.ErrInvalid, "does not go with lifecycle event"},
		{"succeeded as scheduled", contract.Scheduled, contract.SucceededData{Kind: "event", ID: "e", Attempt: 1}, contract.ErrInvalid, "data"},
		{"bad kind", contract.Failed, contract.FailedData{Kind: "Event", ID: "e1", Attempt: 1}, contract.ErrInvalid, "data.kind"},
		{"bad id", contract.Failed, contract.FailedData{Kind: "event", ID: "e.1", Attempt: 1}, contract.ErrInvalid, "data.id"},
		{"attempt 0", contract.Failed, contract.FailedData{Kind: "event", ID: "e1"}, contract.ErrInvalid, "data.attempt"},
		{"bad class", contract.Failed, contract.FailedData{Kind: "event", ID: "e1", Attempt: 1, Error: contract.ErrorInfo{Class: "Rate Limit"}}, contract.ErrInvalid, "data.error.class"},
		{"long message", contract.Failed, contract.FailedData{Kind: "event", ID: "e1", Attempt: 1, Error: contract.ErrorInfo{Message: strings.Repeat("m", contract.MaxMessageLen+1)}}, contract.ErrInvalid, "data.error.message"},
		{"long reason", contract.Failed, contract.FailedData{Kind: "event", ID: "e1", Attempt: 1, Reason: strings.Repeat("r", 65)}, contract.ErrInvalid, "data.reason"},
		{"bad job type", contract.Failed, contract.FailedData{Kind: "job", ID: "e1", Attempt: 1, JobType: "Send Email"}, contract.ErrInvalid, "data.job_type"},
		{"hold without reason", contract.Held, contract.HeldData{Kind: "event", ID: "e1", Attempt: 1}, contract.ErrInvalid, "data.reason"},
		{"hold reason unknown", contract.Held, contract.HeldData{Kind: "event", ID: "e1", Attempt: 1, Reason: "source_paused"}, contract.ErrInvalid, "data.reason"},
		{"hold until zero", contract.Held, contract.HeldData{Kind: "event", ID: "e1", Attempt: 1, Reason: "pause", Until: &time.Time{}}, contract.ErrInvalid, "data.until"},
		{"hold key not a token", contract.Held, contract.HeldData{Kind: "event", ID: "e1", Attempt: 1, Reason: "pause", HoldKey: "a.b"}, contract.ErrInvalid, "data.hold_key"},
		{"hold as failed", contract.Failed, contract.HeldData{Kind: "event", ID: "e1", Attempt: 1, Reason: "pause"}, contract.ErrInvalid, "does not go with lifecycle event"},
		{"release without key", contract.Released, contract.ReleasedData{Kind: "event", Reason: "resume", ReleasedAt: now}, contract.ErrInvalid, "data.hold_key"},
		{"release without time", contract.Released, contract.ReleasedData{Kind: "event", HoldKey: "shop", Reason: "resume"}, contract.ErrInvalid, "data.released_at"},
		{"release reason unknown", contract.Released, contract.ReleasedData{Kind: "event", HoldKey: "shop", Reason: "done", ReleasedAt: now}, contract.ErrInvalid, "data.reason"},
		{"release hold reason unknown", contract.Released, contract.ReleasedData{Kind: "event", HoldKey: "shop", Reason: "resume", ReleasedAt: now, HoldReason: "nap"}, contract.ErrInvalid, "data.hold_reason"},
		{"release count negative", contract.Released, contract.ReleasedData{Kind: "event", HoldKey: "shop", Reason: "resume", ReleasedAt: now, Count: -1}, contract.ErrInvalid, "data.count"},
		{"release id not an id", contract.Released, contract.ReleasedData{Kind: "event", HoldKey: "shop", Reason: "resume", ReleasedAt: now, ReleaseID: "a.b"}, contract.ErrInvalid, "data.release_id"},
		{"pace without start", contract.Released, contract.ReleasedData{Kind: "event", HoldKey: "shop", Reason: "resume", ReleasedAt: now, Pace: &contract.ReleasePace{Limit: 5, WindowMS: 1000}}, contract.ErrInvalid, "data.pace.from"},
		{"pace without limit", contract.Released, contract.ReleasedData{Kind: "event", HoldKey: "shop", Reason: "resume", ReleasedAt: now, Pace: &contract.ReleasePace{From: now, WindowMS: 1000}}, contract.ErrInvalid, "data.pace.limit"},
		{"pace window too long", contract.Released, contract.ReleasedData{Kind: "event", HoldKey: "shop", Reason: "resume", ReleasedAt: now, Pace: &contract.ReleasePace{From: now, Limit: 5, WindowMS: 1 << 40}}, contract.ErrInvalid, "data.pace.window_ms"},
		{"pace skips a whole window", contract.Released, contract.ReleasedData{Kind: "event", HoldKey: "shop", Reason: "resume", ReleasedAt: now, Pace: &contract.ReleasePace{From: now, Limit: 5, WindowMS: 1000, Skip: 5}}, contract.ErrInvalid, "data.pace.skip"},
		{"pace with a count", contract.Released, contract.ReleasedData{Kind: "event", HoldKey: "shop", Reason: "resume", ReleasedAt: now, Count: 1, Pace: &contract.ReleasePace{From: now, Limit: 5, WindowMS: 1000}}, contract.ErrInvalid, "data.pace"},
		{"owner admits with a count", contract.Released, contract.ReleasedData{Kind: "event", HoldKey: "shop", Reason: "resume", ReleasedAt: now, Count: 1, OwnerAdmits: true}, contract.ErrInvalid, "data.owner_admits"},
		{"bad source", contract.Failed, contract.FailedData{Kind: "event", ID: "e1", Attempt: 1, Source: "a.b"}, contract.ErrInvalid, "data.source"},
		{"max retries", contract.Failed, contract.FailedData{Kind: "job", ID: "e1", Attempt: 1, MaxRetries: new(-1)}, contract.ErrInvalid, "data.max_retries"},
		{"payload not json", contract.Failed, contract.FailedData{Kind: "job", ID: "e1", Attempt: 1, Payload: json.RawMessage(`{`)}, contract.ErrInvalid, "data.payload"},
		{"checkpoint too big", contract.Failed, contract.FailedData{Kind: "job", ID: "e1", Attempt: 1, Checkpoint: json.RawMessage(`"` + strings.Repeat("x", contract.MaxDataBytes) + `"`)}, contract.ErrTooLarge, "data.checkpoint"},
		{"payload and checkpoint over the envelope limit", contract.Failed, contract.FailedData{Kind: "job", ID: "e1", Attempt: 1, Payload: big, Checkpoint: big}, contract.ErrTooLarge, "envelope"},
		{"metadata", contract.Failed, contract.FailedData{Kind: "job", ID: "e1", Attempt: 1, Metadata: map[string]string{"": "x"}}, contract.ErrInvalid, "data.metadata"},
		{"no next attempt", contract.Scheduled, contract.ScheduledData{Kind: "job", ID: "e1", Attempt: 2}, contract.ErrInvalid, "data.next_attempt_at"},
		{"exhausted reason", contract.Exhausted, contract.ExhaustedData{Kind: "job", ID: "e1", Attempt: 2, Reason: "tired"}, contract.ErrInvalid, "data.reason"},
		{"cancelled by nobody", contract.Cancelled, contract.CancelledData{Kind: "job", ID: "e1"}, contract.ErrInvalid, "data.by"},
		{"cancelled attempt", contract.Cancelled, contract.CancelledData{Kind: "job", ID: "e1", Attempt: -1, By: "op"}, contract.ErrInvalid, "data.attempt"},
		{"due payload", contract.Due, contract.DueData{Kind: "job", ID: "e1", Attempt: 2, Payload: json.RawMessage(`[1,]`)}, contract.ErrInvalid, "data.payload"},
		{"succeeded attempt", contract.Succeeded, contract.SucceededData{Kind: "job", ID: "e1"}, contract.ErrInvalid, "data.attempt"},
		{"executor too long", contract.Failed, contract.FailedData{Kind: "job", ID: "e1", Attempt: 1, Executor: strings.Repeat("w", contract.MaxTokenLen+1)}, contract.ErrInvalid, "data.executor"},
		{"executor with a newline", contract.Failed, contract.FailedData{Kind: "job", ID: "e1", Attempt: 1, Executor: "host\nevil"}, contract.ErrInvalid, "data.executor"},
		{"executor with a tab", contract.Succeeded, contract.SucceededData{Kind: "job", ID: "e1", Attempt: 1, Executor: "host\t1"}, contract.ErrInvalid, "data.executor"},
		{"executor not UTF-8", contract.Succeeded, contract.SucceededData{Kind: "job", ID: "e1", Attempt: 1, Executor: "host\xff"}, contract.ErrInvalid, "data.executor"},
		{"executor of a hold with a control character", contract.Held, contract.HeldData{Kind: "job", ID: "e1", Attempt: 1, Reason: "pause", Executor: "host\x1b[31m"}, contract.ErrInvalid, "data.executor"},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			t.Parallel()
			msg, err := newLifecycle(tc.ev, tc.data)
			require.Nil(t, msg)
			requireFieldErr(t, err, tc.target, tc.field)
		})
	}
}

// The largest payload and checkpoint the envelope can carry still build,
// and the decoder accepts what the builder built.
func TestLifecycleSizeBoundary(t *testing.T) {
	t.Parallel()
	payload := json.RawMessage(`"` + strings.Repeat("p", contract.MaxDataBytes-2) + `"`)
	d := contract.DueData{Kind: "job", ID: "j", Attempt: 2, Payload: payload}
	msg, err := contract.NewLifecycleMsg("s", contract.Due, d, now)
	require.NoError(t, err)
	got, err := contract.DecodeLifecycle(msg.Subject, msg.Data)
	require.NoError(t, err)
	require.Len(t, got.Due.Payload, contract.MaxDataBytes)

	// The largest checkpoint that still fits next to that payload builds
	// and decodes; one byte more is refused as too large for the envelope,
	// not as a checkpoint error.
	withCheckpoint := func(n int) (*nats.Msg, error) {
		d.Checkpoint = json.RawMessage(`"` + strings.Repeat("c", n) + `"`)
		return contract.NewLifecycleMsg("s", contract.Due, d, now)
	}
	lo, hi := 0, contract.MaxDataBytes-2 // lo builds, hi does not
	_, err = withCheckpoint(hi)
	require.Error(t, err)
	for hi-lo > 1 {
		mid := (lo + hi) / 2
		if _, err := withCheckpoint(mid); err == nil {
			lo = mid
		} else {
			hi = mid
		}
	}
	msg, err = withCheckpoint(lo)
	require.NoError(t, err)
	require.LessOrEqual(t, len(msg.Data), contract.MaxEnvelopeBytes)
	require.Greater(t, len(msg.Data), contract.MaxEnvelopeBytes-512, "the whole envelope is usable, minus headers")
	_, err = contract.DecodeLifecycle(msg.Subject, msg.Data)
	require.NoError(t, err)
	_, err = withCheckpoint(lo + 1)
	requireFieldErr(t, err, contract.ErrTooLarge, "envelope")
}

// newLifecycle calls NewLifecycleMsg with the concrete data type (its item
// parameter is unexported).
func newLifecycle(ev contract.Lifecycle, data any) (*nats.Msg, error) {
	switch d := data.(type) {
	case contract.FailedData:
		return contract.NewLifecycleMsg("retryd/test", ev, d, now)
	case contract.SucceededData:
		return contract.NewLifecycleMsg("retryd/test", ev, d, now)
	case contract.ScheduledData:
		return contract.NewLifecycleMsg("retryd/test", ev, d, now)
	case contract.DueData:
		return contract.NewLifecycleMsg("retryd/test", ev, d, now)
	case contract.ExhaustedData:
		return contract.NewLifecycleMsg("retryd/test", ev, d, now)
	case contract.CancelledData:
		return contract.NewLifecycleMsg("retryd/test", ev, d, now)
	case contract.HeldData:
		return contract.NewLifecycleMsg("retryd/test", ev, d, now)
	case contract.ReleasedData:
		return contract.NewLifecycleMsg("retryd/test", ev, d, now)
	}
	panic("unknown data type")
}

func itemOf(data any) (string, string, int) {
	switch d := data.(type) {
	case contract.FailedData:
		return d.Kind, d.ID, d.Attempt
	case contract.SucceededData:
		return d.Kind, d.ID, d.Attempt
	case contract.ScheduledData:
		return d.Kind, d.ID, d.Attempt
	case contract.DueData:
		return d.Kind, d.ID, d.Attempt
	case contract.ExhaustedData:
		return d.Kind, d.ID, d.Attempt
	case contract.CancelledData:
		return d.Kind, d.ID, d.Attempt
	case contract.HeldData:
		return d.Kind, d.ID, d.Attempt
	case contract.ReleasedData:
		return d.Kind, d.HoldKey, 0
	}
	panic("unknown data type")
}

// lifecycleData returns the data field of a decoded event that is set, by
// value, and how many are set (one, unless decoding is broken).
func lifecycleData(ev contract.LifecycleEvent) (data any, set int) {
	for _, v := range []any{deref(ev.Failed), deref(ev.Succeeded), deref(ev.Scheduled), deref(ev.Due),
		deref(ev.Exhausted), deref(ev.Cancelled), deref(ev.Held), deref(ev.Released)} {
		if v != nil {
			data, set = v, set+1
		}
	}
	return data, set
}

// deref is *p, or an untyped nil for a nil p so that callers can tell.
func deref[T any](p *T) any {
	if p == nil {
		return nil
	}
	return *p
}

// Errors from types that decode themselves (times, retry_after) still name
// the field.
func TestDecodeErrorsNameSelfDecodingFields(t *testing.T) {
	t.Parallel()
	msg, err := newLifecycle(contract.Scheduled, lifecycleSamples()[contract.Scheduled])
	require.NoError(t, err)
	body := strings.Replace(string(msg.Data), `"next_attempt_at":"2025-03-14T15:10:56.535Z"`, `"next_attempt_at":"2025-13-14T15:10:56Z"`, 1)
	require.NotEqual(t, string(msg.Data), body)
	_, err = contract.DecodeLifecycle(msg.Subject, []byte(body))
	requireFieldErr(t, err, contract.ErrInvalid, `field "next_attempt_at"`)

	body = strings.Replace(string(msg.Data), `"time":"2025-03-14T15:09:26.535Z"`, `"time":17`, 1)
	require.NotEqual(t, string(msg.Data), body)
	_, err = contract.DecodeLifecycle(msg.Subject, []byte(body))
	requireFieldErr(t, err, contract.ErrInvalid, `field "time"`)

	failed, err := newLifecycle(contract.Failed, lifecycleSamples()[contract.Failed])
	require.NoError(t, err)
	body = strings.Replace(string(failed.Data), `"retry_after":60`, `"retry_after":"soon"`, 1)
	require.NotEqual(t, string(failed.Data), body)
	_, err = contract.DecodeLifecycle(failed.Subject, []byte(body))
	requireFieldErr(t, err, contract.ErrInvalid, `field "retry_after"`)
}

// Owners that predate the held event reported holds as failures with a
// reason; those reasons still mean a hold, and no other reason does.
func TestLegacyHoldReason(t *testing.T) {
	t.Parallel()
	for reason, want := range map[string]string{
		"source_throttled": contract.HoldThrottle, "trigger_throttled": contract.HoldThrottle,
		"source_paused": contract.HoldPause, "max_concurrency": contract.HoldConcurrency,
	} {
		got, ok := contract.LegacyHoldReason(reason)
		require.True(t, ok, reason)
		require.Equal(t, want, got, reason)
	}
	for _, reason := range []string{"", "timeout", "pause", "throttle"} {
		_, ok := contract.LegacyHoldReason(reason)
		require.False(t, ok, reason)
	}
}

// Two resumes of one source are two facts; the same resume twice is one.
func TestReleasedMsgID(t *testing.T) {
	t.Parallel()
	at := time.Date(2026, 1, 2, 3, 4, 5, 6000, time.UTC)
	require.Equal(t, "event-released:shop:1767323045000006", contract.ReleasedMsgID("event", "shop", at))
	require.NotEqual(t, contract.ReleasedMsgID("event", "shop", at), contract.ReleasedMsgID("event", "shop", at.Add(time.Microsecond)))
}

// A freed slot's release is named by the run that freed it.
func TestReleasedByIDRoundTrip(t *testing.T) {
	t.Parallel()
	d := contract.ReleasedData{Kind: contract.KindEventTrigger, HoldKey: "t1", Reason: contract.ReleaseSlotFreed,
		ReleasedAt: now, HoldReason: contract.HoldConcurrency, Count: 1, ReleaseID: "run-d1"}
	msg, err := contract.NewLifecycleMsg("retryd/triggers", contract.Released, d, now)
	require.NoError(t, err)
	require.Equal(t, "event-trigger-released:t1:run-d1", msg.Header.Get(contract.HeaderMsgID))
	got, err := contract.DecodeLifecycle(msg.Subject, msg.Data)
	require.NoError(t, err)
	require.Equal(t, d, *got.Released)
}

func TestCheckLifecycleHeaders(t *testing.T) {
	t.Parallel()
	msg, err := contract.NewLifecycleMsg("test", contract.Failed, contract.FailedData{Kind: "job", ID: "j1", Attempt: 2,
		Error: contract.ErrorInfo{Class: "timeout", Message: "slow"}}, time.Now())
	require.NoError(t, err)
	lc, err := contract.DecodeLifecycle(msg.Subject, msg.Data)
	require.NoError(t, err)
	require.NoError(t, contract.CheckLifecycleHeaders(msg.Header, lc))

	for name, tc := range map[string]struct {
		spoil func(nats.Header)
		field string
	}{
		"no msg id":       {func(h nats.Header) { h.Del(contract.HeaderMsgID) }, "header Nats-Msg-Id"},
		"other msg id":    {func(h nats.Header) { h.Set(contract.HeaderMsgID, "job-failed:j1:3") }, "header Nats-Msg-Id"},
		"attempt differs": {func(h nats.Header) { h.Set(contract.HeaderAttempt, "3") }, "header Retryd-Attempt"},
		"kind differs":    {func(h nats.Header) { h.Set(contract.HeaderKind, "event") }, "header Retryd-Kind"},
		"item differs":    {func(h nats.Header) { h.Set(contract.HeaderItemID, "j2") }, "header Retryd-Item-Id"},
		"event differs":   {func(h nats.Header) { h.Set(contract.HeaderEvent, "held") }, "header Retryd-Event"},
		"event twice":     {func(h nats.Header) { h.Add(contract.HeaderEvent, "failed") }, "header Retryd-Event"},
	} {
		h := nats.Header{}
		for k, v := range msg.Header {
			h[k] = append([]string(nil), v...)
		}
		tc.spoil(h)
		err := contract.CheckLifecycleHeaders(h, lc)
		require.ErrorIs(t, err, contract.ErrInvalid, name)
		var fe *contract.FieldError
		require.ErrorAs(t, err, &fe, name)
		require.Equal(t, tc.field, fe.Field, name)
		require.NotContains(t, err.Error(), "j1:3", "%s: the reason names the header, not its value", name)
	}

	// Optional headers may be left out; a release's item is its hold key.
	h := nats.Header{contract.HeaderMsgID: {lc.Envelope.ID}}
	require.NoError(t, contract.CheckLifecycleHeaders(h, lc))
	rel, err := contract.NewLifecycleMsg("test", contract.Released, contract.ReleasedData{Kind: "event", HoldKey: "shop",
		Reason: contract.ReleaseResume, ReleasedAt: time.Now()}, time.Now())
	require.NoError(t, err)
	rlc, err := contract.DecodeLifecycle(rel.Subject, rel.Data)
	require.NoError(t, err)
	require.NoError(t, contract.CheckLifecycleHeaders(rel.Header, rlc))
}
