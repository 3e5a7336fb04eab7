package ingress_test

import (
	"encoding/json"
	"net/http"
	"net/url"
	"testing"
	"time"

	"github.com/nats-io/nats.go"
	"github.com/stretchr/testify/require"

	"github.com/retryd/retryd/pkg/contract"
	"github.com/retryd/retryd/services/ingress"
)

const shopURI = "https://shop.example.com/orders"

// admittedEnvelope waits for the event id on EVENTS and returns its
// subject and members.
func (b *bundle) admittedEnvelope(t *testing.T, id string) (string, map[string]any) {
	t.Helper()
	var subject string
	var members map[string]any
	require.Eventually(t, func() bool {
		for _, m := range streamMsgs(t, b.ctx, b.js, contract.StreamEvents, "events.") {
			var got map[string]any
			if json.Unmarshal(m.Data, &got) == nil && got["id"] == id {
				subject, members = m.Subject, got
				return true
			}
		}
		return false
	}, eventually, 50*time.Millisecond, "event %s never admitted", id)
	return subject, members
}

// CloudEvents as the specification writes them: a URI-reference source,
// extension attributes kept and passed on to EVENTS, in structured mode
// and in binary mode (ce-* headers) over HTTP.
func TestCloudEventsOverHTTP(t *testing.T) {
	t.Parallel()
	b := setup(t)
	key := contract.SourceKey(shopURI)

	var acc struct{ ID string }
	require.Equal(t, http.StatusAccepted, b.do(t, http.MethodPost, "/v1/events", map[string]any{
		"specversion": "1.0", "id": "ce-structured", "source": shopURI, "type": "order.created",
		"partitionkey": "customer-7", "traceparent": "00-4bf92f3577b34da6a3ce929d0e0e4736-00f067aa0ba902b7-01",
		"sampled": true, "data": map[string]any{"n": 1},
	}, &acc))
	subject, env := b.admittedEnvelope(t, "ce-structured")
	require.Equal(t, "events."+key+".order.created", subject)
	require.Equal(t, shopURI, env["source"], "the source is kept as sent")
	require.Equal(t, "customer-7", env["partitionkey"])
	require.Equal(t, true, env["sampled"])
	require.Contains(t, env, "traceparent")

	// Binary mode: the body is the data, ce-* headers the attributes.
	status := b.do(t, http.MethodPost, "/v1/events", map[string]any{"n": 2}, nil,
		"Ce-Specversion", "1.0", "Ce-Id", "ce-binary", "Ce-Source", shopURI, "Ce-Type", "order.paid",
		"Ce-Subject", "order%2042", "Ce-Partitionkey", "customer-8")
	require.Equal(t, http.StatusAccepted, status)
	subject, env = b.admittedEnvelope(t, "ce-binary")
	require.Equal(t, "events."+key+".order.paid", subject)
	require.Equal(t, "order 42", env["subject"])
	require.Equal(t, "customer-8", env["partitionkey"])
	require.Equal(t, map[string]any{"n": 2.0}, env["data"])

	// The gate knows the URI source by its key: a pause through the API
	// (the URI, escaped, as the path segment) holds its events.
	require.Equal(t, http.StatusOK, b.do(t, http.MethodPost, "/v1/sources/"+url.PathEscape(shopURI)+"/pause", nil, nil))
	var src struct {
		Source string `json:"source"`
		Paused bool   `json:"paused"`
	}
	require.Equal(t, http.StatusOK, b.do(t, http.MethodGet, "/v1/sources/"+key, nil, &src))
	require.True(t, src.Paused, "the pause by URI is the key's")
	b.post(t, map[string]any{"id": "ce-held", "source": shopURI, "type": "order.created"})
	b.waitStatus(t, "deferred", "ce-held")

	// Binary mode refuses what retryd cannot keep: data that is not JSON,
	// and a header that is not an attribute's name.
	var e apiError
	require.Equal(t, http.StatusUnsupportedMediaType, b.do(t, http.MethodPost, "/v1/events", "plain text", &e,
		"Content-Type", "text/plain", "Ce-Specversion", "1.0", "Ce-Id", "x", "Ce-Source", "shop", "Ce-Type", "a.b"))
	require.Equal(t, http.StatusBadRequest, b.do(t, http.MethodPost, "/v1/events", map[string]any{}, &e,
		"Ce-Specversion", "1.0", "Ce-Id", "x", "Ce-Source", "shop", "Ce-Type", "a.b", "Ce-Bad_name", "v"))
	require.Equal(t, "ce-bad_name", e.Error.Field)
}

// A producer on NATS may publish in binary mode too: ce-* headers on
// ingest.<key>, the data as the body. EVENTS carries the event structured,
// its extensions kept; a source whose key is not the subject's is
// refused.
func TestCloudEventsBinaryOverNATS(t *testing.T) {
	t.Parallel()
	b := setup(t)
	key := contract.SourceKey(shopURI)
	msg := nats.NewMsg(contract.IngestSubject(shopURI))
	msg.Header.Set("ce-specversion", "1.0")
	msg.Header.Set("ce-id", "ce-nats")
	msg.Header.Set("ce-source", shopURI)
	msg.Header.Set("ce-type", "order.shipped")
	msg.Header.Set("ce-partitionkey", "customer-9")
	msg.Header.Set("content-type", "application/json")
	msg.Header.Set(contract.HeaderMsgID, "ce-nats")
	msg.Data = []byte(`{"n":3}`)
	_, err := b.js.PublishMsg(b.ctx, msg)
	require.NoError(t, err)
	subject, env := b.admittedEnvelope(t, "ce-nats")
	require.Equal(t, "events."+key+".order.shipped", subject)
	require.Equal(t, "customer-9", env["partitionkey"])
	require.Equal(t, map[string]any{"n": 3.0}, env["data"])

	wrong := nats.NewMsg("ingest.other")
	for k, v := range msg.Header {
		wrong.Header[k] = v
	}
	wrong.Header.Set("ce-id", "ce-wrong")
	wrong.Header.Set(contract.HeaderMsgID, "ce-wrong")
	wrong.Data = msg.Data
	_, err = b.js.PublishMsg(b.ctx, wrong)
	require.NoError(t, err)
	require.Eventually(t, func() bool {
		return b.counter(t, "retryd_ingress_malformed_total", map[string]string{"consumer": ingress.ConsumerGate}) == 1
	}, eventually, 20*time.Millisecond, "a source whose key is not the subject's is terminated")
	require.Zero(t, b.count(t, `SELECT count(*) FROM workflow_events WHERE event_id = 'ce-wrong'`))
}
