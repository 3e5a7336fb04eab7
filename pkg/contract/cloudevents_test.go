package contract_test

import (
	"encoding/json"
	"net/http"
	"strings"
	"testing"
	"time"

	"github.com/stretchr/testify/require"

	"github.com/retryd/retryd/pkg/contract"
)

// The JSON format's conformance cases (github.com/cloudevents/conformance,
// format/json): every valid event decodes as a producer event, with its
// extension attributes kept; every invalid one is refused. retryd's own
// rules are stricter in two places, both kept on purpose: an id must be
// subject-safe (all these are), and data is JSON (so data_base64 is
// refused).
func TestCloudEventsConformanceValid(t *testing.T) {
	t.Parallel()
	const base = `"specversion":"1.0","type":"io.cloudevents.test","source":"https://cloudevents.io"`
	for _, tc := range []struct {
		name, body string
		ext        map[string]any
	}{
		{"minimal", `{` + base + `,"id":"minimal"}`, nil},
		{"null optionals", `{` + base + `,"id":"minimal","datacontenttype":null,"dataschema":null,"subject":null,"time":null}`, nil},
		{"all core attributes", `{` + base + `,"id":"allCore","datacontenttype":"text/plain","dataschema":"https://cloudevents.io/dataschema","subject":"tests","time":"2018-04-05T17:31:00Z"}`, nil},
		{"time to the nanosecond", `{` + base + `,"id":"t1","time":"2018-04-05T17:31:00.000000000Z"}`, nil},
		{"time with a positive offset", `{` + base + `,"id":"t2","time":"2018-04-05T18:31:00+01:00"}`, nil},
		{"time with a negative offset", `{` + base + `,"id":"t3","time":"2018-04-05T16:31:00-01:00"}`, nil},
		{"relative source", `{"id":"rel","specversion":"1.0","type":"io.cloudevents.test","source":"#fragment"}`, nil},
		{"text data", `{` + base + `,"id":"text","datacontenttype":"text/plain","data":"Simple text"}`, nil},
		{"extensions of every type", `{` + base + `,"id":"allExtensionTypes","extinteger":10,"extboolean":true,"extstring":"text",` +
			`"exturi":"https://cloudevents.io","exturiref":"//authority/path","exttimestamp":"2023-03-31T15:12:00Z","extbinary":"TWE=","extnull":null}`,
			map[string]any{"extinteger": int64(10), "extboolean": true, "extstring": "text", "exturi": "https://cloudevents.io",
				"exturiref": "//authority/path", "exttimestamp": "2023-03-31T15:12:00Z", "extbinary": "TWE="}},
	} {
		ev, err := contract.DecodeProducerEvent([]byte(tc.body))
		require.NoError(t, err, tc.name)
		require.Equal(t, tc.ext, ev.Extensions, tc.name)
	}
}

func TestCloudEventsConformanceInvalid(t *testing.T) {
	t.Parallel()
	const base = `"type":"io.cloudevents.test","source":"https://cloudevents.io"`
	for _, tc := range []struct{ name, body, field string }{
		{"no type", `{"specversion":"1.0","id":"x","source":"https://cloudevents.io"}`, "type"},
		{"no source", `{"specversion":"1.0","id":"x","type":"io.cloudevents.test"}`, "source"},
		{"time garbage", `{"specversion":"1.0","id":"x",` + base + `,"time":"lunchtime"}`, "event"},
		{"time to the minute", `{"specversion":"1.0","id":"x",` + base + `,"time":"2018-04-05T18:31Z"}`, "event"},
		{"time offset X", `{"specversion":"1.0","id":"x",` + base + `,"time":"2018-04-05T18:31:00X"}`, "event"},
		{"time offset out of range", `{"specversion":"1.0","id":"x",` + base + `,"time":"2018-04-05T18:31:00+25:00"}`, "event"},
		{"time offset not a number", `{"specversion":"1.0","id":"x",` + base + `,"time":"2018-04-05T18:31:00+xx:00"}`, "event"},
		{"time offset hours only", `{"specversion":"1.0","id":"x",` + base + `,"time":"2018-04-05T18:31:00+05"}`, "event"},
		{"empty id", `{"specversion":"1.0","id":"",` + base + `}`, "id"},
		{"empty type", `{"specversion":"1.0","id":"x","type":"","source":"https://cloudevents.io"}`, "type"},
		{"empty source", `{"specversion":"1.0","id":"x","type":"io.cloudevents.test","source":""}`, "source"},
		{"empty specversion", `{"specversion":"","id":"x",` + base + `}`, "specversion"},
		{"unknown specversion", `{"specversion":"0.9","id":"x",` + base + `}`, "specversion"},
		{"not an RFC 2046 media type", `{"specversion":"1.0","id":"x",` + base + `,"datacontenttype":"xyz"}`, "datacontenttype"},
		{"empty datacontenttype", `{"specversion":"1.0","id":"x",` + base + `,"datacontenttype":""}`, "datacontenttype"},
		{"empty dataschema", `{"specversion":"1.0","id":"x",` + base + `,"dataschema":""}`, "dataschema"},
		{"relative dataschema", `{"specversion":"1.0","id":"x",` + base + `,"dataschema":"/schema"}`, "dataschema"},
		{"empty subject", `{"specversion":"1.0","id":"x",` + base + `,"subject":""}`, "subject"},
		{"numeric id", `{"specversion":"1.0","id":25,` + base + `}`, "event"},
		{"object id", `{"specversion":"1.0","id":{"xyz":"abc"},` + base + `}`, "event"},
		{"capitalized extension", `{"specversion":"1.0","id":"x",` + base + `,"MyExtension":"bad"}`, "MyExtension"},
		{"punctuated extension", `{"specversion":"1.0","id":"x",` + base + `,"my.extension":"bad"}`, "my.extension"},
		{"extension over 20 characters", `{"specversion":"1.0","id":"x",` + base + `,"abcdefghijklmnopqrstu":"bad"}`, "abcdefghijklmnopqrstu"},
		{"non-integer extension", `{"specversion":"1.0","id":"x",` + base + `,"myextension":1.5}`, "myextension"},
		{"object extension", `{"specversion":"1.0","id":"x",` + base + `,"myextension":{"a":1}}`, "myextension"},
		{"extension too long", `{"specversion":"1.0","id":"x",` + base + `,"myextension":"` + strings.Repeat("v", 1025) + `"}`, "myextension"},
		{"data and data_base64", `{"specversion":"1.0","id":"x",` + base + `,"data":"text","data_base64":"eyAieHl6IjogMTIzIH0="}`, "data_base64"},
		{"source with a space", `{"specversion":"1.0","id":"x","type":"io.cloudevents.test","source":"a b"}`, "source"},
	} {
		_, err := contract.DecodeProducerEvent([]byte(tc.body))
		var fe *contract.FieldError
		require.ErrorAs(t, err, &fe, tc.name)
		require.ErrorIs(t, err, contract.ErrInvalid, tc.name)
		require.Equal(t, tc.field, fe.Field, "%s: %v", tc.name, err)
	}
	var many strings.Builder
	for i := range contract.MaxExtensions + 1 {
		many.WriteString(`,"ext` + strings.Repeat("a", i%10) + string(rune('a'+i/10)) + `":1`)
	}
	_, err := contract.DecodeProducerEvent([]byte(`{"specversion":"1.0","id":"x",` + base + many.String() + `}`))
	require.ErrorIs(t, err, contract.ErrInvalid, "more than MaxExtensions")
}

// Extensions pass through: a producer event's extensions are members of
// the envelope it becomes, and decode again from INGEST and EVENTS.
func TestExtensionsPassThrough(t *testing.T) {
	t.Parallel()
	ev, err := contract.DecodeProducerEvent([]byte(`{"id":"e1","source":"https://shop.example.com/orders","type":"order.created",` +
		`"partitionkey":"customer-7","sampled":true,"priority":3,"data":{"n":1}}`))
	require.NoError(t, err)
	env := ev.Envelope("unused", time.Date(2025, 3, 14, 15, 9, 26, 0, time.UTC))
	body, err := env.Marshal()
	require.NoError(t, err)
	var members map[string]any
	require.NoError(t, json.Unmarshal(body, &members))
	require.Equal(t, "customer-7", members["partitionkey"])
	require.Equal(t, true, members["sampled"])
	require.EqualValues(t, 3, members["priority"])

	back, err := contract.DecodeEventMsg(body)
	require.NoError(t, err)
	require.Equal(t, ev.Extensions, back.Extensions)
	require.Equal(t, "https://shop.example.com/orders", back.Source, "the source is kept as sent")
	again, err := back.Marshal()
	require.NoError(t, err)
	require.JSONEq(t, string(body), string(again))
}

// A source that is a token is its own key; any other URI-reference gets a
// readable token of its own, the same every time, distinct for sources
// that differ only in punctuation.
func TestSourceKey(t *testing.T) {
	t.Parallel()
	require.Equal(t, "shop", contract.SourceKey("shop"))
	key := contract.SourceKey("https://shop.example.com/orders")
	require.True(t, strings.HasPrefix(key, "shop-example-com-orders-"), key)
	require.NoError(t, contract.ValidateToken("key", key))
	require.Equal(t, key, contract.SourceKey("https://shop.example.com/orders"))
	require.NotEqual(t, key, contract.SourceKey("https://shop.example.com/orders/"))
	require.NotEqual(t, contract.SourceKey("Shop"), contract.SourceKey("shop"))
	for _, s := range []string{"#fragment", "/", "https://" + strings.Repeat("a", 200), "//authority/path"} {
		require.NoError(t, contract.ValidateToken("key", contract.SourceKey(s)), s)
	}
	require.Equal(t, "ingest."+key, contract.IngestSubject("https://shop.example.com/orders"))
	require.Equal(t, "events."+key+".order.created", contract.EventSubject("https://shop.example.com/orders", "order.created"))
}

// Binary mode: the attributes are ce- headers, the data the body.
func TestDecodeBinaryEvent(t *testing.T) {
	t.Parallel()
	h := http.Header{}
	h.Set("Ce-Specversion", "1.0")
	h.Set("Ce-Id", "bin-1")
	h.Set("Ce-Source", "https://shop.example.com/orders")
	h.Set("Ce-Type", "order.created")
	h.Set("Ce-Time", "2018-04-05T17:31:00Z")
	h.Set("Ce-Subject", "order%2042") // percent-encoded space
	h.Set("Ce-Partitionkey", "customer-7")
	h.Set("Content-Type", "application/json; charset=utf-8")
	require.True(t, contract.IsBinaryEvent(h))
	ev, err := contract.DecodeProducerMsg(h, []byte(`{"n":1}`))
	require.NoError(t, err)
	require.Equal(t, "bin-1", ev.ID)
	require.Equal(t, "order 42", ev.Subject)
	require.Equal(t, map[string]any{"partitionkey": "customer-7"}, ev.Extensions)
	require.JSONEq(t, `{"n":1}`, string(ev.Data))
	require.Equal(t, "application/json; charset=utf-8", ev.DataContentType)

	// NATS headers keep their case: matched all the same.
	nh := map[string][]string{"ce-specversion": {"1.0"}, "ce-id": {"bin-2"}, "ce-source": {"shop"}, "ce-type": {"a.b"}}
	ev, err = contract.DecodeProducerMsg(nh, nil)
	require.NoError(t, err)
	require.Equal(t, "shop", ev.Source)
	require.Empty(t, ev.Data)

	// A structured body wins over stray ce- headers.
	sh := map[string][]string{"ce-specversion": {"1.0"}, "Content-Type": {contract.ContentTypeCloudEvents}}
	require.False(t, contract.IsBinaryEvent(sh))

	for _, tc := range []struct {
		name  string
		edit  func(h http.Header)
		body  string
		field string
	}{
		{"text data", func(h http.Header) { h.Set("Content-Type", "text/plain") }, "hi", "datacontenttype"},
		{"not JSON", nil, "{", "data"},
		{"bad time", func(h http.Header) { h.Set("Ce-Time", "noon") }, "", "ce-time"},
		{"bad extension name", func(h http.Header) { h.Set("Ce-Part_key", "x") }, "", "ce-part_key"},
		{"empty attribute", func(h http.Header) { h.Set("Ce-Subject", "") }, "", "ce-subject"},
		{"twice", func(h http.Header) { h.Add("Ce-Type", "other") }, "", "ce-type"},
		{"bad escape", func(h http.Header) { h.Set("Ce-Subject", "a%zz") }, "", "ce-subject"},
		{"wrong specversion", func(h http.Header) { h.Set("Ce-Specversion", "0.3") }, "", "ce-specversion"},
		{"datacontenttype header", func(h http.Header) { h.Set("Ce-Datacontenttype", "application/json") }, "", "ce-datacontenttype"},
		{"bad source", func(h http.Header) { h.Set("Ce-Source", "a%20b c") }, "", "source"},
	} {
		h2 := h.Clone()
		if tc.edit != nil {
			tc.edit(h2)
		}
		_, err := contract.DecodeBinaryEvent(h2, []byte(tc.body))
		var fe *contract.FieldError
		require.ErrorAs(t, err, &fe, tc.name)
		require.Equal(t, tc.field, fe.Field, "%s: %v", tc.name, err)
	}
}
