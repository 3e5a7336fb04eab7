package faults_test

import (
	"context"
	"encoding/json"
	"fmt"
	"net/http"
	"strings"
	"testing"
	"time"

	"github.com/nats-io/nats.go"
	"github.com/nats-io/nats.go/jetstream"

	"github.com/retryd/retryd/faults/harness"
	"github.com/retryd/retryd/pkg/contract"
)

// badInputs is the corpus: truncated JSON, invalid UTF-8, 10,000-deep
// nesting, huge numbers, missing fields, unknown attributes, extension
// attributes that break their rules, unknown types,
// wrong JSON types and a 10 MB body.
func badInputs() map[string][]byte {
	deep := strings.Repeat("[", 10_000) + strings.Repeat("]", 10_000)
	huge := strings.Repeat("9", 5000)
	big := `{"source":"shop","type":"order.created","data":"` + strings.Repeat("x", 10<<20) + `"}`
	return map[string][]byte{
		"empty":                 {},
		"truncated":             []byte(`{"source":"shop","type":"order.created","data":{"n":`),
		"not json":              []byte(`hello`),
		"invalid utf-8":         []byte("{\"source\":\"sh\xffop\",\"type\":\"order.created\"}"),
		"invalid utf-8 in data": []byte("{\"source\":\"shop\",\"type\":\"order.created\",\"data\":\"\xc3\x28\"}"),
		"10000-deep nesting":    []byte(`{"source":"shop","type":"order.created","data":` + deep + `}`),
		"huge number as time":   []byte(`{"source":"shop","type":"order.created","time":` + huge + `}`),
		"huge number as source": []byte(`{"source":1e999999,"type":"order.created"}`),
		"missing source":        []byte(`{"type":"order.created"}`),
		"missing type":          []byte(`{"source":"shop"}`),
		// Neither an attribute nor an extension attribute (whose names are
		// lowercase letters and digits, and values scalars): refused by
		// every decoder, the producer events' included.
		"unknown attribute":    []byte(`{"source":"shop","type":"order.created","sneaky_attr":true}`),
		"extension not scalar": []byte(`{"source":"shop","type":"order.created","sneaky":{"a":1}}`),
		"unknown type":         []byte(`{"source":"shop","type":"order.unheard_of"}`),
		"wrong json type":      []byte(`{"source":["shop"],"type":"order.created"}`),
		"bad id":               []byte(`{"id":"a.b*c>","source":"shop","type":"order.created"}`),
		"trailing data":        []byte(`{"source":"shop","type":"order.created"} {"again":1}`),
		"10 MB body":           []byte(big),
	}
}

// Scenario 10: the corpus over HTTP (ingress events and batches, the
// scheduler's policy API, the triggers API) and over NATS (every durable
// consumer's subjects): HTTP answers 400 or 413 with a JSON error body,
// malformed messages are terminated and counted, nothing is stored,
// nothing panics.
func TestScenario10BadInput(t *testing.T) {
	t.Parallel()
	s := setup(t, harness.Options{NATS: harness.NATSConfig{}})
	r := &harness.Report{Scenario: "10 bad input over HTTP and NATS"}
	s.Start(harness.Scheduler)
	s.Start(harness.Ingress)
	s.Start(harness.Triggers)
	s.Start(harness.Worker, "FAULTWORKER_TYPES=work")
	s.MustDo(http.MethodPut, s.URL(harness.Ingress)+"/v1/sources/shop", map[string]any{"allowed_types": []string{"order.created"}}, http.StatusOK)
	corpus := badInputs()

	// HTTP.
	type endpoint struct{ service, method, path string }
	endpoints := []endpoint{
		{harness.Ingress, http.MethodPost, "/v1/events"},
		{harness.Ingress, http.MethodPost, "/v1/events:batch"},
		{harness.Scheduler, http.MethodPut, "/v1/policies/ft/_"},
		{harness.Triggers, http.MethodPost, "/v1/triggers"},
	}
	httpCases := 0
	for _, ep := range endpoints {
		for name, body := range corpus {
			if ep.path == "/v1/events:batch" {
				body = append(append([]byte(`{"events":[`), body...), ']', '}')
			}
			status, out, err := s.Do(ep.method, s.URL(ep.service)+ep.path, body)
			httpCases++
			if err != nil {
				t.Errorf("%s %s %s: %v", ep.method, ep.path, name, err)
				continue
			}
			var e struct {
				Error struct{ Code, Message, Field string } `json:"error"`
			}
			if status != http.StatusBadRequest && status != http.StatusRequestEntityTooLarge {
				t.Errorf("%s %s %q: status %d, want 400 or 413: %.200s", ep.method, ep.path, name, status, out)
			} else if json.Unmarshal(out, &e) != nil || e.Error.Code == "" || e.Error.Message == "" {
				t.Errorf("%s %s %q: error body is not {\"error\":{code,message}}: %.200s", ep.method, ep.path, name, out)
			}
		}
	}
	r.Fault("%d HTTP requests (%d inputs x %d endpoints)", httpCases, len(corpus), len(endpoints))

	// NATS: the corpus as the data of every stream a durable consumer
	// reads, without and with a CloudEvents envelope around it.
	subjects := []string{
		"ingest.shop",                 // ingress-gate
		"retry.event.due.bad1",        // ingress-retry
		"retry.event.scheduled.bad1",  // ingress-retry-state
		"events.shop.order.created",   // triggers-events
		"retry.event-trigger.due.b1",  // triggers-retry
		"runs.fulfil.completed.run-1", // triggers-runs
		"retry.ft.failed.bad1",        // scheduler
		"jobs.work",                   // worker
		"retry.job.due.bad1",          // worker-due-router
	}
	stored, refused := 0, 0
	for _, subj := range subjects {
		for name, body := range corpus {
			for _, wrapped := range []bool{false, true} {
				data := body
				if wrapped {
					env, _ := json.Marshal(map[string]any{"specversion": "1.0", "id": "bad", "source": "faults", "type": "x", "time": time.Now()})
					data = append(env[:len(env)-1], []byte(`,"data":`+string(body)+`}`)...)
				}
				msg := &nats.Msg{Subject: subj, Data: data, Header: nats.Header{}}
				if _, err := s.JS.PublishMsg(s.Ctx, msg); err != nil {
					refused++ // over the max message size: the broker refuses it
					continue
				}
				stored++
				_ = name
			}
		}
	}
	r.Fault("%d NATS messages stored on %d subjects, %d refused by the broker (over 1 MiB)", stored, len(subjects), refused)
	r.Sent = httpCases + stored

	// Every durable consumer ends with nothing pending: each bad message
	// was terminated, not left to be redelivered forever. The consumers
	// are listed from the streams, so a consumer a service adds later is
	// checked too.
	start := time.Now()
	var stuck []string
	checked := map[string]bool{}
	_, ok := harness.Eventually(s.Ctx, 2*time.Minute, 200*time.Millisecond, func() bool {
		stuck = stuck[:0]
		for _, stream := range []string{contract.StreamIngest, contract.StreamEvents, contract.StreamRetries, contract.StreamRuns, contract.StreamJobs} {
			st, err := s.JS.Stream(s.Ctx, stream)
			if err != nil {
				stuck = append(stuck, stream+": "+err.Error())
				continue
			}
			infos := st.ListConsumers(s.Ctx)
			for info := range infos.Info() {
				if info.Config.Durable == "" {
					continue
				}
				checked[stream+"/"+info.Name] = true
				if info.NumPending != 0 || info.NumAckPending != 0 {
					stuck = append(stuck, fmt.Sprintf("%s/%s: %s", stream, info.Name, describe(info, nil)))
				}
			}
		}
		return len(stuck) == 0
	})
	r.Recover = time.Since(start)
	if !ok {
		t.Errorf("consumers still hold bad messages: %v", stuck)
	}
	var rows int
	_ = s.Pool.QueryRow(s.Ctx, `SELECT (SELECT count(*) FROM workflow_events) + (SELECT count(*) FROM retries)
 + (SELECT count(*) FROM workflow_trigger_deliveries) + (SELECT count(*) FROM workflow_runs) + (SELECT count(*) FROM fault_job_runs)
 + (SELECT count(*) FROM workflow_triggers) + (SELECT count(*) FROM retry_policies WHERE kind = 'ft')`).Scan(&rows)
	if rows != 0 {
		t.Errorf("bad input stored %d rows", rows)
	}
	r.Lost = rows // here: rows that should not exist
	malformed := s.Metric(harness.Ingress, "retryd_ingress_malformed_total") + s.Metric(harness.Triggers, "retryd_triggers_malformed_total") +
		s.Metric(harness.Scheduler, "retryd_scheduler_malformed_total") + s.Metric(harness.Worker, "retryd_worker_malformed_total")
	malformed += s.Metric(harness.Scheduler, "retryd_jobs_malformed_total")
	r.Note("malformed messages counted by the services: %.0f (a message read by two consumers counts twice); %d durable consumers checked", malformed, len(checked))
	if len(checked) < 10 {
		t.Errorf("only %d durable consumers found: %v", len(checked), checked)
	}
	for _, p := range s.Processes() {
		if !p.Running() {
			t.Errorf("%s exited", p.Name)
		}
	}
	if p := s.Panics(); len(p) > 0 {
		t.Errorf("panics in the logs of %v", p)
	}
	r.Print(t)
}

func consumerInfo(ctx context.Context, js jetstream.JetStream, stream, name string) (*jetstream.ConsumerInfo, error) {
	c, err := js.Consumer(ctx, stream, name)
	if err != nil {
		return nil, err
	}
	return c.Info(ctx)
}

func describe(info *jetstream.ConsumerInfo, err error) string {
	if err != nil {
		return err.Error()
	}
	return fmt.Sprintf("pending %d, ack pending %d, redelivered %d", info.NumPending, info.NumAckPending, info.NumRedelivered)
}
