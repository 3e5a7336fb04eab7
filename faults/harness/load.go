package harness

import (
	"context"
	"encoding/json"
	"fmt"
	"net/http"
	"sync"
	"sync/atomic"
	"time"

	"github.com/nats-io/nats.go"
	"github.com/nats-io/nats.go/jetstream"

	"github.com/retryd/retryd/pkg/contract"
)

// FailedMsg builds retry.<kind>.failed.<id> for attempt, as an owner
// publishes it.
func FailedMsg(kind, id string, attempt int, class string, retryAfter *contract.RetryAfter) (*nats.Msg, error) {
	return contract.NewLifecycleMsg("faults/load", contract.Failed, &contract.FailedData{
		Kind: kind, ID: id, Attempt: attempt, RetryAfter: retryAfter,
		Error: contract.ErrorInfo{Class: class, Message: "fault suite: first attempt failed"},
	}, time.Now())
}

// PublishAll publishes msgs asynchronously and republishes every one that
// was not acknowledged (NATS down, timeout) until all are, or ctx ends.
// It returns how many PubAcks said duplicate.
func PublishAll(ctx context.Context, js jetstream.JetStream, msgs []*nats.Msg) (duplicates int, err error) {
	pending := msgs
	for len(pending) > 0 {
		type inflight struct {
			msg *nats.Msg
			fut jetstream.PubAckFuture
		}
		var (
			futs  []inflight
			retry []*nats.Msg
		)
		for _, m := range pending {
			f, err := js.PublishMsgAsync(m)
			if err != nil {
				retry = append(retry, m)
				continue
			}
			futs = append(futs, inflight{m, f})
		}
		timeout := time.After(30 * time.Second)
	wait:
		for i, f := range futs {
			select {
			case ack := <-f.fut.Ok():
				if ack.Duplicate {
					duplicates++
				}
			case <-f.fut.Err():
				retry = append(retry, f.msg)
			case <-timeout:
				for _, rest := range futs[i:] {
					retry = append(retry, rest.msg)
				}
				break wait
			case <-ctx.Done():
				return duplicates, ctx.Err()
			}
		}
		pending = retry
		if len(pending) > 0 {
			select {
			case <-ctx.Done():
				return duplicates, ctx.Err()
			case <-time.After(100 * time.Millisecond):
			}
		}
	}
	return duplicates, nil
}

// EventSender posts events to ingress over HTTP and sends each again
// with the same id until it gets a 202 (as the docs tell producers to),
// recording the ids ingress accepted.
type EventSender struct {
	Sys *System
	// URL is the ingress base URL.
	URL string
	// Every, when set, paces SendAll: one event handed out per interval,
	// so faults can land in the middle of the load.
	Every time.Duration

	mu       sync.Mutex
	accepted map[string]bool
	// Retries counts sends beyond the first (503s, refused connections
	// while ingress is down).
	Retries   atomic.Int64
	Duplicate atomic.Int64
}

// Accepted returns the ids that got a 202.
func (e *EventSender) Accepted() map[string]bool {
	e.mu.Lock()
	defer e.mu.Unlock()
	out := make(map[string]bool, len(e.accepted))
	for k := range e.accepted {
		out[k] = true
	}
	return out
}

// Send posts one event until it is accepted or ctx ends.
func (e *EventSender) Send(ctx context.Context, ev map[string]any) error {
	id, _ := ev["id"].(string)
	body, err := json.Marshal(ev)
	if err != nil {
		return err
	}
	for try := 0; ; try++ {
		if try > 0 {
			e.Retries.Add(1)
			select {
			case <-ctx.Done():
				return ctx.Err()
			case <-time.After(time.Duration(min(try, 10)) * 50 * time.Millisecond):
			}
		}
		status, out, err := e.Sys.Do(http.MethodPost, e.URL+"/v1/events", body)
		if err != nil || status == http.StatusServiceUnavailable || status >= 500 {
			continue
		}
		if status != http.StatusAccepted {
			return fmt.Errorf("post event %s: status %d: %s", id, status, out)
		}
		var resp struct {
			ID        string `json:"id"`
			Duplicate bool   `json:"duplicate"`
		}
		_ = json.Unmarshal(out, &resp)
		if resp.Duplicate {
			e.Duplicate.Add(1)
		}
		e.mu.Lock()
		if e.accepted == nil {
			e.accepted = map[string]bool{}
		}
		e.accepted[id] = true
		e.mu.Unlock()
		return nil
	}
}

// SendAll sends events with n goroutines.
func (e *EventSender) SendAll(ctx context.Context, events []map[string]any, n int) error {
	ch := make(chan map[string]any)
	var wg sync.WaitGroup
	var firstErr atomic.Value
	for range n {
		wg.Add(1)
		go func() {
			defer wg.Done()
			for ev := range ch {
				if err := e.Send(ctx, ev); err != nil {
					firstErr.CompareAndSwap(nil, err)
				}
			}
		}()
	}
	for _, ev := range events {
		if e.Every > 0 {
			time.Sleep(e.Every)
		}
		select {
		case ch <- ev:
		case <-ctx.Done():
		}
	}
	close(ch)
	wg.Wait()
	if err, ok := firstErr.Load().(error); ok {
		return err
	}
	return ctx.Err()
}
