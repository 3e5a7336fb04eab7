package decoders_test

import (
	"bytes"
	"errors"
	"net/http/httptest"
	"strings"
	"testing"

	"github.com/retryd/retryd/internal/serve"
	"github.com/retryd/retryd/pkg/contract"
	"github.com/retryd/retryd/pkg/contract/contracttest"
	"github.com/retryd/retryd/services/scheduler"
)

func seeds(f *testing.F) {
	f.Add([]byte(`{"specversion":"1.0","id":"x","source":"s","type":"run.completed","time":"2025-01-01T00:00:00Z","data":{"run_id":"r1","workflow":"wf"}}`))
	f.Add([]byte(`{"specversion":"1.0","id":"e1","source":"shop","type":"order.created","time":"2025-01-01T00:00:00Z","data":{"n":1}}`))
	f.Add([]byte(`{"specversion":"1.0","id":"e1","source":"shop","type":"order.created","time":"2025-01-01T00:00:00Z","data":{"n":1e999999}}`))
	f.Add([]byte(`{"specversion":"1.0","id":"e1","source":"shop","type":"order.created","time":"2025-01-01T00:00:00Z","data":` + strings.Repeat("[", 40) + strings.Repeat("]", 40) + `}`))
	f.Add([]byte("{\"specversion\":\"1.0\",\"id\":\"\xff\"}"))
	f.Add([]byte(`{"specversion":"1.0"`))
	f.Add([]byte(`{}`))
	f.Add([]byte(``))
}

func FuzzDecodeRunFinished(f *testing.F) {
	seeds(f)
	f.Fuzz(func(t *testing.T, body []byte) {
		for _, subj := range []string{"runs.wf.completed.r1", "runs.wf.failed.r1", "runs.wf.requested.r1", "runs..x"} {
			_, d, err := contract.DecodeRunFinished(subj, body)
			if err != nil {
				contracttest.CheckRefusal(t, err)
				continue
			}
			if err := d.Validate(); err != nil {
				t.Fatalf("decoded run does not validate: %v", err)
			}
		}
	})
}

func FuzzDecodeEventMsg(f *testing.F) {
	seeds(f)
	f.Fuzz(func(t *testing.T, body []byte) {
		env, err := contract.DecodeEventMsg(body)
		if err != nil {
			contracttest.CheckRefusal(t, err)
			return
		}
		// An admitted event must be publishable again as it was decoded.
		if _, err := contract.NewEventMsg(contract.EventSubject(env.Source, env.Type), env); err != nil && !errors.Is(err, contract.ErrTooLarge) {
			t.Fatalf("decoded event does not build again: %v", err)
		}
	})
}

func FuzzDecodeEnvelope(f *testing.F) {
	seeds(f)
	f.Fuzz(func(t *testing.T, body []byte) {
		env, err := contract.DecodeEnvelope(body)
		if err != nil {
			contracttest.CheckRefusal(t, err)
			return
		}
		b, err := env.Marshal()
		if err != nil {
			t.Fatalf("decoded envelope does not marshal: %v", err)
		}
		if _, err := contract.DecodeEnvelope(b); err != nil && !errors.Is(err, contract.ErrTooLarge) {
			t.Fatalf("envelope does not decode after a round trip: %v", err)
		}
	})
}

func FuzzParseSubjects(f *testing.F) {
	for _, s := range []string{"events.shop.order.created", "ingest.shop", "runs.wf.requested.r1", "jobs.work", "events..x", "ingest.*", "jobs.>", "runs.a.b.c.d", ""} {
		f.Add(s)
	}
	f.Fuzz(func(t *testing.T, subject string) {
		if _, _, err := contract.ParseEventSubject(subject); err != nil {
			contracttest.CheckRefusal(t, err)
		}
		if _, err := contract.ParseIngestSubject(subject); err != nil {
			contracttest.CheckRefusal(t, err)
		}
		if _, err := contract.ParseRunSubject(subject); err != nil {
			contracttest.CheckRefusal(t, err)
		}
		if jt, err := contract.ParseJobSubject(subject); err != nil {
			contracttest.CheckRefusal(t, err)
		} else if contract.JobSubject(jt) != subject {
			t.Fatalf("job subject %q parsed to %q", subject, jt)
		}
	})
}

// FuzzDecodeJSONPolicy drives serve.DecodeJSON, which every HTTP API
// uses, with the scheduler's policy request.
func FuzzDecodeJSONPolicy(f *testing.F) {
	f.Add([]byte(`{"name":"p","max_retries":3,"base_delay_ms":1000,"max_delay_ms":5000}`))
	f.Add([]byte(`{"name":"p","max_retries":1e400}`))
	f.Add([]byte(`{"name":"p","sneaky":1}`))
	f.Add([]byte(strings.Repeat("[", 10000)))
	f.Add([]byte("{\"name\":\"\xc3\x28\"}"))
	f.Add([]byte(`{"name":"p"} trailing`))
	f.Fuzz(func(t *testing.T, body []byte) {
		req := httptest.NewRequest("PUT", "/v1/policies/ft/_", bytes.NewReader(body))
		req.Header.Set("Content-Type", "application/json")
		var p scheduler.PolicyRequest
		if err := serve.DecodeJSON(req, 64<<10, &p); err != nil {
			contracttest.CheckRefusal(t, err)
		}
	})
}
