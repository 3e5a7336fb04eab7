package faults_test

import (
	"encoding/json"
	"fmt"
	"net/http"
	"testing"
	"time"

	"github.com/nats-io/nats.go"

	"github.com/retryd/retryd/faults/harness"
	"github.com/retryd/retryd/pkg/contract"
)

// Secret values the scenario plants; none may reach a log.
var secrets = map[string]string{
	"authorization header": "Bearer sk_live_FAULTSECRET_A1",
	"password":             "hunter2-FAULTSECRET-B2",
	"card number":          "4111111111111111",
}

// Scenario 11: secrets in event data, job payloads, failure messages and
// checkpoints travel the whole pipeline (deferrals, held deliveries,
// retries, dues) with every service logging at debug level: none appears
// in any log. Malformed input that carries a secret in a field value is
// checked separately, since the services echo the bad value in their
// error reasons.
func TestScenario11SecretsNeverLogged(t *testing.T) {
	t.Parallel()
	s := setup(t, harness.Options{})
	r := &harness.Report{Scenario: "11 secrets never in logs"}
	debug := "RETRYD_LOG_LEVEL=debug"
	s.Start(harness.Scheduler, debug)
	s.Start(harness.Ingress, debug)
	s.Start(harness.Triggers, debug)
	s.Start(harness.Worker, debug, "FAULTWORKER_TYPES=work")
	s.Policy(contract.KindEvent, "", fastPolicy("faults-11-event", 300*time.Millisecond, 50))
	s.Policy(contract.KindEventTrigger, "", fastPolicy("faults-11-trigger", 300*time.Millisecond, 50))
	s.Policy(contract.KindJob, "work", fastPolicy("faults-11-work", 300*time.Millisecond, 3))
	s.Policy("ft", "", fastPolicy("faults-11-ft", 300*time.Millisecond, 3))
	s.MustDo(http.MethodPut, s.URL(harness.Ingress)+"/v1/sources/vault", map[string]any{"rate_limit": 2, "rate_window": "1s"}, http.StatusOK)
	s.MustDo(http.MethodPost, s.URL(harness.Triggers)+"/v1/triggers", map[string]any{
		"id": "vault", "name": "vault", "source": "vault", "event_type": "login.attempted",
		"predicate": `has(data.password)`, "throttle": map[string]any{"limit": 1, "window": "1s"}, "workflow": "audit",
	}, http.StatusCreated)
	owner := s.NewOwner("ft", func(d contract.DueData) harness.Outcome { return harness.Outcome{Fail: d.Attempt < 3} })
	owner.Start()

	secretData := map[string]any{
		"authorization": secrets["authorization header"], "password": secrets["password"],
		"card": map[string]any{"number": secrets["card number"], "cvc": "123"},
	}
	n := 8
	sender := &harness.EventSender{Sys: s, URL: s.URL(harness.Ingress)}
	for i := range n {
		if err := sender.Send(s.Ctx, map[string]any{"id": fmt.Sprintf("s11-ev-%d", i), "source": "vault",
			"type": "login.attempted", "data": secretData}); err != nil {
			t.Fatal(err)
		}
	}
	payload, _ := json.Marshal(map[string]any{"fail_attempts": 1, "message": "login failed for password=" + secrets["password"] +
		" with " + secrets["authorization header"], "secret": secretData})
	var msgs []*nats.Msg
	for i := range n {
		m, err := contract.NewJobMsg("faults/load", contract.JobData{ID: fmt.Sprintf("s11-job-%d", i), JobType: "work", Attempt: 1,
			Payload: payload, Metadata: map[string]string{"note": "card " + secrets["card number"]}}, time.Now())
		if err != nil {
			t.Fatal(err)
		}
		msgs = append(msgs, m)
		f, err := contract.NewLifecycleMsg("faults/load", contract.Failed, &contract.FailedData{
			Kind: "ft", ID: fmt.Sprintf("s11-item-%d", i), Attempt: 1, Payload: payload, Checkpoint: payload,
			Error: contract.ErrorInfo{Message: "upstream said: Authorization: " + secrets["authorization header"]},
		}, time.Now())
		if err != nil {
			t.Fatal(err)
		}
		msgs = append(msgs, f)
	}
	if _, err := harness.PublishAll(s.Ctx, s.JS, msgs); err != nil {
		t.Fatal(err)
	}
	r.Sent = 3 * n
	start := time.Now()
	_, ok := harness.Eventually(s.Ctx, scenarioTimeout(), 200*time.Millisecond, func() bool {
		var events, runs, jobs int
		_ = s.Pool.QueryRow(s.Ctx, `SELECT (SELECT count(*) FROM workflow_events WHERE status = 'admitted'),
 (SELECT count(*) FROM workflow_runs), (SELECT count(DISTINCT job_id) FROM fault_job_effects)`).Scan(&events, &runs, &jobs)
		return events == n && runs == n && jobs == n && states(s.Ctx, s.Pool, "ft")["succeeded"] == n
	})
	r.Recover = time.Since(start)
	if !ok {
		t.Fatalf("the secret-carrying load did not complete")
	}
	for what, secret := range secrets {
		if hits := s.LogsContain(secret); len(hits) > 0 {
			t.Errorf("the %s from valid payloads appears in the logs of %v", what, hits)
			r.Lost++
		}
	}
	r.Note("valid payloads with secrets: %d events (deferred and throttled), %d jobs, %d owner items; every service at debug level", n, n, n)
	r.Print(t)

	t.Run("MalformedInputEchoingSecrets", func(t *testing.T) {
		// The secret sits where an id, a kind or a type belongs: the
		// refusal reason quotes the bad value, and a service that logs the
		// reason logs the secret.
		const marker = "sk_live_FAULTSECRET_E5"
		bad := []*nats.Msg{
			{Subject: "ingest.vault", Data: []byte(`{"id":"Bearer ` + marker + `","source":"vault","type":"login.attempted"}`), Header: nats.Header{}},
			{Subject: "retry.ft.failed.x1", Data: envelopeWith(`{"kind":"Bearer ` + marker + `","id":"x1","attempt":1,"error":{"message":"m"}}`), Header: nats.Header{}},
			{Subject: "jobs.work", Data: envelopeWith(`{"id":"Bearer ` + marker + `","job_type":"work","attempt":1}`), Header: nats.Header{}},
		}
		if _, err := harness.PublishAll(s.Ctx, s.JS, bad); err != nil {
			t.Fatal(err)
		}
		status, body, _ := s.Do(http.MethodPost, s.URL(harness.Ingress)+"/v1/events",
			`{"id":"Bearer `+marker+`","source":"vault","type":"login.attempted"}`)
		if status != http.StatusBadRequest {
			t.Fatalf("POST with a secret as id: status %d: %s", status, body)
		}
		var hits []string
		harness.Eventually(s.Ctx, 10*time.Second, 100*time.Millisecond, func() bool {
			hits = s.LogsContain(marker)
			return len(hits) > 0
		})
		if len(hits) > 0 {
			t.Fatalf("a secret placed in an id/kind field of malformed input was logged by %v: "+
				"terminations must log contract.LogReason (quoted values redacted)", hits)
		}
	})
}

// envelopeWith wraps data in a CloudEvents envelope.
func envelopeWith(data string) []byte {
	return []byte(`{"specversion":"1.0","id":"bad-1","source":"faults","type":"retry.failed","time":"2025-01-01T00:00:00Z","data":` + data + `}`)
}
