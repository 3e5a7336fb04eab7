package contract_test

import (
	"encoding/json"
	"testing"

	"github.com/retryd/retryd/pkg/contract"
)

// A failed fact as the bench's owner and a worker publish it: an error,
// a small payload and two metadata keys.
func BenchmarkDecodeLifecycle(b *testing.B) {
	msg, err := contract.NewLifecycleMsg("retryd/worker", contract.Failed, contract.FailedData{
		Kind: "job", ID: "01JBENCH0000000000000000000", Attempt: 1,
		Error:    contract.ErrorInfo{Class: "timeout", Message: "upstream timed out after 5s"},
		JobType:  "email_send",
		Payload:  json.RawMessage(`{"to":"user@example.com","template":"welcome","vars":{"name":"Ada","n":3}}`),
		Metadata: map[string]string{"tenant": "acme", "trace": "abc123"},
		Executor: "worker-1",
	}, now)
	if err != nil {
		b.Fatal(err)
	}
	b.SetBytes(int64(len(msg.Data)))
	b.ReportAllocs()
	for b.Loop() {
		if _, err := contract.DecodeLifecycle(msg.Subject, msg.Data); err != nil {
			b.Fatal(err)
		}
	}
}

// A due as the due loop builds 100,000 of them in a burst.
func BenchmarkNewDueMsg(b *testing.B) {
	d := contract.DueData{
		Kind: "event", ID: "01JBENCH0000000000000000000", Attempt: 2, NextAttemptAt: now,
		Source:   "shop",
		Payload:  json.RawMessage(`{"order":"A-1001","lines":[{"sku":"X","qty":2}]}`),
		Metadata: map[string]string{"tenant": "acme"},
	}
	b.ReportAllocs()
	for b.Loop() {
		if _, err := contract.NewLifecycleMsg("retryd/scheduler", contract.Due, d, now); err != nil {
			b.Fatal(err)
		}
	}
}
