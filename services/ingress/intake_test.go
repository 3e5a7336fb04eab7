package ingress_test

import (
	"encoding/json"
	"fmt"
	"net/http"
	"strings"
	"testing"
	"time"

	"github.com/nats-io/nats.go"
	"github.com/nats-io/nats.go/jetstream"
	"github.com/stretchr/testify/require"

	"github.com/retryd/retryd/internal/natstest"
	"github.com/retryd/retryd/internal/serve"
	"github.com/retryd/retryd/internal/servicetest"
	"github.com/retryd/retryd/pkg/contract"
	"github.com/retryd/retryd/services/ingress"
)

func TestPostEventIsAdmittedOnce(t *testing.T) {
	t.Parallel()
	b := setup(t)

	acc := b.post(t, event("ev-1", "billing", "invoice.paid"))
	require.Equal(t, ingress.Accepted{ID: "ev-1"}, acc)
	acc = b.post(t, event("ev-1", "billing", "invoice.paid"))
	require.Equal(t, ingress.Accepted{ID: "ev-1", Duplicate: true}, acc, "a repeated id is accepted once")

	in := streamMsgs(t, b.ctx, b.js, contract.StreamIngest, "ingest.billing")
	require.Len(t, in, 1)
	require.Equal(t, "ev-1", in[0].Header.Get(nats.MsgIdHdr))
	env, err := contract.DecodeEnvelope(in[0].Data)
	require.NoError(t, err)
	require.Equal(t, contract.SpecVersion, env.SpecVersion)
	require.False(t, env.Time.IsZero(), "intake fills the time")

	b.waitStatus(t, "admitted", "ev-1")
	require.Eventually(t, func() bool { return b.admittedIDs(t)["ev-1"] == 1 }, eventually, 20*time.Millisecond)
	out := streamMsgs(t, b.ctx, b.js, contract.StreamEvents, "events.billing.invoice.paid")
	require.Len(t, out, 1)
	require.JSONEq(t, string(in[0].Data), string(out[0].Data), "the admitted event is the accepted envelope")
	require.Zero(t, b.count(t, `SELECT count(*) FROM event_ingress_retries`), "nothing was deferred")

	require.EqualValues(t, 1, b.counter(t, "retryd_ingress_intake_total", map[string]string{"source": "billing", "result": "accepted"}))
	require.EqualValues(t, 1, b.counter(t, "retryd_ingress_intake_total", map[string]string{"source": "billing", "result": "duplicate"}))
	require.EqualValues(t, 1, b.counter(t, "retryd_ingress_gate_total", map[string]string{"source": "billing", "decision": "admitted"}))
}

func TestPostEventIDs(t *testing.T) {
	t.Parallel()
	b := setup(t)

	acc := b.post(t, event("", "billing", "invoice.paid"))
	require.NoError(t, contract.ValidateID("id", acc.ID), "a generated id")
	require.Len(t, acc.ID, 26, "a ULID")

	var keyed ingress.Accepted
	require.Equal(t, http.StatusAccepted, b.do(t, http.MethodPost, "/v1/events", event("", "billing", "invoice.paid"), &keyed, "Idempotency-Key", "order-42"))
	require.Equal(t, ingress.Accepted{ID: "order-42"}, keyed)
	require.Equal(t, http.StatusAccepted, b.do(t, http.MethodPost, "/v1/events", event("", "billing", "invoice.paid"), &keyed, "Idempotency-Key", "order-42"))
	require.True(t, keyed.Duplicate, "the same key twice is one event")
	require.Equal(t, http.StatusAccepted, b.do(t, http.MethodPost, "/v1/events", event("order-42", "billing", "invoice.paid"), &keyed, "Idempotency-Key", "order-42"))

	var e apiError
	require.Equal(t, http.StatusBadRequest, b.do(t, http.MethodPost, "/v1/events", event("other", "billing", "invoice.paid"), &e, "Idempotency-Key", "order-42"))
	require.Equal(t, "Idempotency-Key", e.Error.Field)
	require.Equal(t, http.StatusBadRequest, b.do(t, http.MethodPost, "/v1/events", event("", "billing", "invoice.paid"), &e, "Idempotency-Key", "a.b"))
	require.Equal(t, "Idempotency-Key", e.Error.Field)
	require.Contains(t, e.Error.Message, "subject token")

	b.waitStatus(t, "admitted", acc.ID, "order-42")
}

func TestPostEventBadInputStoresNothing(t *testing.T) {
	t.Parallel()
	b := setup(t) // MaxBodyBytes is 64 KiB
	b.putSource(t, "billing", map[string]any{"allowed_types": []string{"invoice.paid"}})

	cases := []struct {
		name   string
		body   string
		status int
		field  string
		want   string
	}{
		{"not json", `{"source":`, 400, "event", "truncated"},
		{"empty", ``, 400, "event", "empty"},
		{"not an extension name", `{"source":"billing","type":"invoice.paid","colour_code":1}`, 400, "colour_code", "lowercase letters and digits"},
		{"extension of a wrong type", `{"source":"billing","type":"invoice.paid","colour":[1]}`, 400, "colour", "string, an integer or a boolean"},
		{"data_base64", `{"source":"billing","type":"invoice.paid","data_base64":"TWE="}`, 400, "data_base64", "as JSON"},
		{"wrong type", `{"source":"billing","type":7}`, 400, "event", `"type" must be a string`},
		{"missing type", `{"source":"billing"}`, 400, "type", "required"},
		{"bad source", `{"source":"Bill ing","type":"invoice.paid"}`, 400, "source", "URI-reference"},
		{"bad id", `{"id":"a.b","source":"billing","type":"invoice.paid"}`, 400, "id", "subject token"},
		{"bad specversion", `{"specversion":"0.3","source":"billing","type":"invoice.paid"}`, 400, "specversion", "1.0"},
		{"trailing data", `{"source":"billing","type":"invoice.paid"} {}`, 400, "event", "after"},
		{"deep", `{"source":"billing","type":"invoice.paid","data":` + strings.Repeat("[", 40) + strings.Repeat("]", 40) + `}`, 400, "", "deeper"},
		{"unknown type", `{"source":"billing","type":"invoice.voided"}`, 400, "type", `"invoice.voided"`},
		{"too large", `{"source":"billing","type":"invoice.paid","data":"` + strings.Repeat("x", 70<<10) + `"}`, 413, "body", "limit"},
	}
	for _, c := range cases {
		var e apiError
		status := b.do(t, http.MethodPost, "/v1/events", c.body, &e)
		require.Equal(t, c.status, status, c.name)
		if c.field != "" {
			require.Equal(t, c.field, e.Error.Field, c.name)
		}
		require.Contains(t, e.Error.Message, c.want, c.name)
		if c.status == 413 {
			require.Equal(t, "too_large", e.Error.Code)
		} else {
			require.Equal(t, "invalid_input", e.Error.Code)
		}
	}
	require.Empty(t, streamMsgs(t, b.ctx, b.js, contract.StreamIngest, "ingest."), "nothing published")
	require.Zero(t, b.count(t, `SELECT count(*) FROM workflow_events`), "nothing stored")
	require.EqualValues(t, len(cases)-1, b.counter(t, "retryd_ingress_intake_total", map[string]string{"source": "", "result": "rejected"}))
	require.EqualValues(t, 1, b.counter(t, "retryd_ingress_intake_total", map[string]string{"source": "billing", "result": "rejected"}))
}

func TestBatch(t *testing.T) {
	t.Parallel()
	b := setup(t, func(c *ingress.Config) { c.MaxBatchEvents = 5 })
	b.putSource(t, "crm", map[string]any{"allowed_types": []string{"contact.created"}})

	var res ingress.BatchResponse
	body := map[string]any{"events": []any{
		event("b-1", "billing", "invoice.paid"),
		event("", "crm", "contact.created"),
		event("b-1", "billing", "invoice.paid"),
	}}
	require.Equal(t, http.StatusAccepted, b.do(t, http.MethodPost, "/v1/events:batch", body, &res, "Idempotency-Key", "import-7"))
	require.Equal(t, []ingress.BatchResult{
		{ID: "b-1"},
		{ID: "import-7-1"},
		{ID: "b-1", Duplicate: true},
	}, res.Results)
	b.waitStatus(t, "admitted", "b-1", "import-7-1")

	// One bad event rejects the batch; nothing is published.
	before := len(streamMsgs(t, b.ctx, b.js, contract.StreamIngest, "ingest."))
	var e apiError
	body = map[string]any{"events": []any{event("b-2", "billing", "invoice.paid"), event("b-3", "crm", "contact.deleted")}}
	require.Equal(t, http.StatusBadRequest, b.do(t, http.MethodPost, "/v1/events:batch", body, &e))
	require.Equal(t, "events[1].type", e.Error.Field)
	require.Contains(t, e.Error.Message, `"contact.deleted"`)
	body = map[string]any{"events": []any{event("b-2", "billing", "invoice.paid"), map[string]any{"source": "billing"}}}
	require.Equal(t, http.StatusBadRequest, b.do(t, http.MethodPost, "/v1/events:batch", body, &e))
	require.Equal(t, "events[1].type", e.Error.Field)
	require.Equal(t, http.StatusBadRequest, b.do(t, http.MethodPost, "/v1/events:batch", `{"events":[{"source":"billing","type":"a","x_y":1}]}`, &e))
	require.Equal(t, "events[0].x_y", e.Error.Field)
	require.Equal(t, http.StatusBadRequest, b.do(t, http.MethodPost, "/v1/events:batch", `{"events":[]}`, &e))
	require.Equal(t, "events", e.Error.Field)
	require.Equal(t, http.StatusBadRequest, b.do(t, http.MethodPost, "/v1/events:batch", `{"evts":[]}`, &e))
	require.Equal(t, http.StatusBadRequest, b.do(t, http.MethodPost, "/v1/events:batch", `[]`, &e))
	six := make([]any, 6)
	for i := range six {
		six[i] = event(fmt.Sprintf("s-%d", i), "billing", "invoice.paid")
	}
	require.Equal(t, http.StatusRequestEntityTooLarge, b.do(t, http.MethodPost, "/v1/events:batch", map[string]any{"events": six}, &e))
	require.Equal(t, "events", e.Error.Field)
	require.Contains(t, e.Error.Message, "limit of 5")
	require.Len(t, streamMsgs(t, b.ctx, b.js, contract.StreamIngest, "ingest."), before)
	require.Equal(t, "", b.status(t, "b-2"))
}

func TestPublishFailureIs503(t *testing.T) {
	t.Parallel()
	b := setup(t)
	require.NoError(t, b.js.DeleteStream(b.ctx, contract.StreamIngest))

	var e apiError
	require.Equal(t, http.StatusServiceUnavailable, b.do(t, http.MethodPost, "/v1/events", event("x-1", "billing", "invoice.paid"), &e))
	require.Equal(t, "unavailable", e.Error.Code)
	require.Contains(t, e.Error.Message, "send it again")
	var res ingress.BatchResponse
	require.Equal(t, http.StatusServiceUnavailable, b.do(t, http.MethodPost, "/v1/events:batch",
		map[string]any{"events": []any{event("x-2", "billing", "invoice.paid")}}, &res))
	require.Len(t, res.Results, 1)
	require.NotNil(t, res.Results[0].Error)
	require.EqualValues(t, 2, b.counter(t, "retryd_ingress_intake_total", map[string]string{"source": "billing", "result": "failed"}))
}

func TestIntakeStaysOpenWithoutDatabase(t *testing.T) {
	t.Parallel()
	b := setup(t)
	require.NoError(t, b.svc.Stop(b.ctx))
	b.pool.Close()

	acc := b.post(t, event("while-down", "billing", "invoice.paid"))
	require.False(t, acc.Duplicate)
	in := streamMsgs(t, b.ctx, b.js, contract.StreamIngest, "ingest.billing")
	require.Len(t, in, 1, "accepted durably; the gate stores it when Postgres is back")
}

// A full INGEST (discard new) refuses the event: the intake answers 503
// with Retry-After, every event answered 202 is in the stream and none
// answered 503 is.
func TestFullIngestIs503(t *testing.T) {
	t.Parallel()
	b := setup(t)
	cfg := natstest.SetMaxBytes(t, b.ctx, b.js, contract.StreamIngest, 4<<10) // a few events; below what streams.Options allows
	require.Equal(t, jetstream.DiscardNew, cfg.Discard)

	accepted, refused := servicetest.FillUp(t, 3, func(id string) (*http.Response, []byte) {
		return servicetest.Request(t, b.ctx, http.MethodPost, b.http.URL+"/v1/events", event(id, "billing", "invoice.paid"))
	}, func(resp *http.Response, raw []byte) {
		require.Equal(t, serve.RetryAfterFull, resp.Header.Get("Retry-After"))
		var e apiError
		require.NoError(t, json.Unmarshal(raw, &e))
		require.Equal(t, "unavailable", e.Error.Code)
		require.Contains(t, e.Error.Message, "INGEST is full")
	})

	var res ingress.BatchResponse
	resp, raw := servicetest.Request(t, b.ctx, http.MethodPost, b.http.URL+"/v1/events:batch",
		map[string]any{"events": []any{event("full-batch", "billing", "invoice.paid")}})
	require.Equal(t, http.StatusServiceUnavailable, resp.StatusCode, "%s", raw)
	require.Equal(t, serve.RetryAfterFull, resp.Header.Get("Retry-After"))
	require.NoError(t, json.Unmarshal(raw, &res))
	require.Len(t, res.Results, 1)
	require.NotNil(t, res.Results[0].Error)
	require.Contains(t, res.Results[0].Error.Message, "INGEST is full")
	refused = append(refused, "full-batch")

	var stored []string
	for _, m := range streamMsgs(t, b.ctx, b.js, contract.StreamIngest, "ingest.billing") {
		stored = append(stored, m.Header.Get(nats.MsgIdHdr))
	}
	require.Equal(t, accepted, stored, "every 202 is stored, in order, and no 503")
	require.EqualValues(t, len(refused), b.counter(t, "retryd_ingress_intake_total", map[string]string{"source": "billing", "result": "failed"}))

	// Room again: the refused events, sent again, are stored once.
	natstest.SetMaxBytes(t, b.ctx, b.js, contract.StreamIngest, 1<<20)
	for _, id := range refused {
		require.Equal(t, ingress.Accepted{ID: id}, b.post(t, event(id, "billing", "invoice.paid")), "not stored before")
	}
	b.waitStatus(t, "admitted", append(accepted, refused...)...)
}
