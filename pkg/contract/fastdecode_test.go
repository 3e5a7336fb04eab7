package contract

import (
	"bytes"
	"encoding/json"
	"reflect"
	"testing"
	"unicode/utf8"

	"github.com/stretchr/testify/require"
)

// fastDecodeTargets are the types decodeShaped decodes into.
var fastDecodeTargets = []func() any{
	func() any { return new(Envelope) },
	func() any { return new(ProducerEvent) },
	func() any { return new(FailedData) },
	func() any { return new(SucceededData) },
	func() any { return new(ScheduledData) },
	func() any { return new(DueData) },
	func() any { return new(ExhaustedData) },
	func() any { return new(CancelledData) },
	func() any { return new(HeldData) },
	func() any { return new(ReleasedData) },
	func() any { return new(JobData) },
	func() any { return new(RunRequestedData) },
	func() any { return new(RunFinishedData) },
	func() any { return new(RunHeartbeatData) },
	func() any { return new(RunStepData) },
}

// FuzzFastDecodeMatchesStd holds decodeShaped's fast path to
// encoding/json: whatever the v2 decoder accepts, encoding/json (with
// unknown fields refused) accepts too and decodes to the same value. What
// v2 refuses goes to encoding/json anyway, so this is all that can differ.
func FuzzFastDecodeMatchesStd(f *testing.F) {
	for _, s := range []string{
		`{"kind":"event","id":"a","attempt":1}`,
		`{"kind":"event","id":"a","attempt":1,"error":{"class":"timeout","message":"x"},"payload":{ "a" : [1, 2.50, "\u00e9"] },"metadata":{"k":"v"}}`,
		`{"kind":"job","id":"a","attempt":2,"retry_after":"2025-01-01T00:00:00Z","max_retries":3,"retry_enabled":false,"timeout_ms":5}`,
		`{"kind":"event","id":"a","attempt":1,"retry_after":30}`,
		`{"kind":"event","id":"a","attempt":1,"retry_after":"30"}`,
		`{"KIND":"event","Id":"a","attempt":1}`,
		`{"kind":"event","kind":"job","id":"a","attempt":1}`,
		`{"specversion":"1.0","id":"x","source":"s","type":"retry.failed","time":"2025-01-01T00:00:00.123456789+02:00","data":{"kind":"event"}}`,
		`{"time":"2025-01-01T00:00:00z"}`, `{"time":"2025-01-01 00:00:00Z"}`, `{"time":"2025-01-01T24:00:00Z"}`,
		`{"attempt":1.0}`, `{"attempt":1e2}`, `{"attempt":-0}`, `{"attempt":null}`, `{"metadata":null}`, `{"payload":null}`,
		`{"kind":"\ud800"}`, `{"kind":"a\u0000b"}`, `{"metadata":{"a":1}}`, `{"data":"x"}`, `[]`, `null`, `"s"`,
		`{"priority":"high"}`, `{"priority":"urgent"}`, `{"checkpoint":{"step":1}}`,
	} {
		f.Add([]byte(s))
	}
	f.Fuzz(func(t *testing.T, b []byte) {
		if len(b) == 0 || !utf8.Valid(b) || checkShape("x", b, MaxEnvelopeBytes) != nil {
			return
		}
		for _, target := range fastDecodeTargets {
			fast := target()
			if fastUnmarshal(b, fast) != nil {
				continue
			}
			std := target()
			dec := json.NewDecoder(bytes.NewReader(b))
			dec.DisallowUnknownFields()
			if err := dec.Decode(std); err != nil {
				t.Fatalf("%T: v2 accepts what encoding/json refuses (%v): %q", fast, err, b)
			}
			if !reflect.DeepEqual(fast, std) {
				t.Fatalf("%T: v2 decodes %q to\n%+v\nencoding/json to\n%+v", fast, b, fast, std)
			}
			checkMarshalWithData(t, fast)
		}
	})
}

// checkMarshalWithData holds Envelope.marshalWithData to Marshal for the
// data json.Marshal writes of v.
func checkMarshalWithData(t *testing.T, v any) {
	t.Helper()
	data, err := json.Marshal(v)
	if err != nil {
		return
	}
	env := Envelope{SpecVersion: SpecVersion, ID: "x", Source: "retryd/test", Type: "retry.due", Subject: "event/a", DataContentType: ContentTypeJSON}
	got, err := env.marshalWithData(data)
	if err != nil {
		t.Fatalf("marshalWithData: %v", err)
	}
	env.Data = data
	want, err := env.Marshal()
	if err != nil {
		t.Fatalf("Marshal: %v", err)
	}
	if !bytes.Equal(got, want) {
		t.Fatalf("marshalWithData wrote\n%s\nMarshal\n%s", got, want)
	}
}

func TestMarshalWithData(t *testing.T) {
	t.Parallel()
	for _, v := range []any{
		DueData{Kind: "event", ID: "a", Attempt: 2, Payload: json.RawMessage(`{ "html": "<b>&</b>", "u": "\u00e9\u2028" }`), Metadata: map[string]string{"k": "<v>"}},
		FailedData{Kind: "job", ID: "j", Attempt: 1, Error: ErrorInfo{Message: "a \"quoted\" <error>\n"}},
		map[string]any{}, []int{1, 2},
	} {
		checkMarshalWithData(t, v)
	}
	env := Envelope{SpecVersion: SpecVersion, ID: "x", Source: "s", Type: "t"}
	got, err := env.marshalWithData(nil)
	require.NoError(t, err)
	want, err := env.Marshal()
	require.NoError(t, err)
	require.Equal(t, string(want), string(got), "no data, no member")
}
