package engine

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"strconv"
	"time"

	"github.com/nats-io/nats.go"
	"github.com/nats-io/nats.go/jetstream"

	"github.com/retryd/retryd/pkg/contract"
)

// What the engine keeps on NATS beside RUNS.
const (
	// EffectsStream holds each node's effect, once
	// (workflow.effects.<run_id>.<node>, Nats-Msg-Id
	// effect:<run_id>:<node>), and one message per node execution
	// (workflow.executions.<run_id>.<node>, Nats-Msg-Id
	// execution:<run_id>:<node>:<n>), which tests count.
	EffectsStream = "WORKFLOW_EFFECTS"
	// StateBucket is a KV bucket: the execution counters, the nodes each
	// attempt finished and each attempt's end.
	StateBucket = "WORKFLOW_STATE"
	// stateTTL bounds how long a run's state is kept; a request
	// redelivered later than this runs its nodes again (their effects are
	// still deduplicated by the stream's subject check).
	stateTTL = 7 * 24 * time.Hour
)

// EffectSubject is where a node's effect is published.
func EffectSubject(runID, node string) string { return "workflow.effects." + runID + "." + node }

// ExecutionSubject is where each execution of a node is recorded.
func ExecutionSubject(runID, node string) string { return "workflow.executions." + runID + "." + node }

// Execution is the body of an execution record.
type Execution struct {
	RunID     string          `json:"run_id"`
	Node      string          `json:"node"`
	Attempt   int             `json:"attempt"`
	Execution int             `json:"execution"`
	Input     json.RawMessage `json:"input,omitempty"`
	Executor  string          `json:"executor"`
}

// Effect is the body of an effect.
type Effect struct {
	RunID    string          `json:"run_id"`
	Node     string          `json:"node"`
	Attempt  int             `json:"attempt"`
	Output   json.RawMessage `json:"output"`
	Executor string          `json:"executor"`
}

// ensureStorage creates the effects stream and the state bucket when they
// are missing; existing ones are left as the operator configured them.
func ensureStorage(ctx context.Context, js jetstream.JetStream) (jetstream.Stream, jetstream.KeyValue, error) {
	st, err := js.Stream(ctx, EffectsStream)
	if errors.Is(err, jetstream.ErrStreamNotFound) {
		st, err = js.CreateStream(ctx, jetstream.StreamConfig{
			Name:        EffectsStream,
			Description: "retryd example workflow: node effects (once each) and node executions",
			Subjects:    []string{"workflow.effects.*.*", "workflow.executions.*.*"},
			MaxAge:      stateTTL,
			// The window catches an effect published twice in a row; the
			// subject check before each publish catches older ones.
			Duplicates: time.Hour,
		})
	}
	if err != nil {
		return nil, nil, fmt.Errorf("ensure stream %s: %w", EffectsStream, err)
	}
	kv, err := js.KeyValue(ctx, StateBucket)
	if errors.Is(err, jetstream.ErrBucketNotFound) {
		kv, err = js.CreateKeyValue(ctx, jetstream.KeyValueConfig{
			Bucket:      StateBucket,
			Description: "retryd example workflow: execution counters and finished nodes per attempt",
			TTL:         stateTTL,
		})
	}
	if err != nil {
		return nil, nil, fmt.Errorf("ensure bucket %s: %w", StateBucket, err)
	}
	return st, kv, nil
}

// State keys. Run ids and node names are [A-Za-z0-9_-], valid in keys.
func execKey(runID, node string) string { return runID + ".exec." + node }
func doneKey(runID string, attempt int, node string) string {
	return runID + "." + strconv.Itoa(attempt) + ".done." + node
}
func endKey(runID string, attempt int) string { return runID + "." + strconv.Itoa(attempt) + ".end" }

// nextExecution counts one more execution of node in run and returns its
// number. The counter is updated with compare-and-set, so two engines
// handed the same run (a redelivery racing a slow one) never share a
// number.
func (e *Engine) nextExecution(ctx context.Context, runID, node string) (int, error) {
	key := execKey(runID, node)
	for {
		entry, err := e.state.Get(ctx, key)
		switch {
		case errors.Is(err, jetstream.ErrKeyNotFound):
			if _, err := e.state.Create(ctx, key, []byte("1")); err == nil {
				return 1, nil
			} else if !errors.Is(err, jetstream.ErrKeyExists) {
				return 0, fmt.Errorf("count execution of %s: %w", node, err)
			}
		case err != nil:
			return 0, fmt.Errorf("count execution of %s: %w", node, err)
		default:
			n, err := strconv.Atoi(string(entry.Value()))
			if err != nil {
				return 0, fmt.Errorf("count execution of %s: counter %q: %w", node, entry.Value(), err)
			}
			n++
			if _, err := e.state.Update(ctx, key, []byte(strconv.Itoa(n)), entry.Revision()); err == nil {
				return n, nil
			} else if !errors.Is(err, jetstream.ErrKeyExists) {
				return 0, fmt.Errorf("count execution of %s: %w", node, err)
			}
		}
		// Lost a race with another engine: read the counter again.
	}
}

// lookup reads a state key; ok is false when it is not set.
func (e *Engine) lookup(ctx context.Context, key string) (value []byte, ok bool, err error) {
	entry, err := e.state.Get(ctx, key)
	if errors.Is(err, jetstream.ErrKeyNotFound) {
		return nil, false, nil
	}
	if err != nil {
		return nil, false, fmt.Errorf("read state %s: %w", key, err)
	}
	return entry.Value(), true, nil
}

func (e *Engine) remember(ctx context.Context, key string, value []byte) error {
	if _, err := e.state.Put(ctx, key, value); err != nil {
		return fmt.Errorf("write state %s: %w", key, err)
	}
	return nil
}

// recordExecution publishes one execution record; its id carries the
// execution number, so a publish retried by the client is stored once.
func (e *Engine) recordExecution(ctx context.Context, x Execution) error {
	msg, err := jsonMsg(ExecutionSubject(x.RunID, x.Node), fmt.Sprintf("execution:%s:%s:%d", x.RunID, x.Node, x.Execution), x)
	if err != nil {
		return err
	}
	if _, err := e.cfg.JS.PublishMsg(ctx, msg); err != nil {
		return fmt.Errorf("record execution of %s: %w", x.Node, err)
	}
	return nil
}

// applyEffect performs a node's effect at most once per run: it is
// skipped when the stream already holds it (an earlier execution got that
// far), and its Nats-Msg-Id makes the stream drop a copy that races the
// check within the duplicate window.
func (e *Engine) applyEffect(ctx context.Context, fx Effect) (applied bool, err error) {
	subject := EffectSubject(fx.RunID, fx.Node)
	if _, err := e.effects.GetLastMsgForSubject(ctx, subject); err == nil {
		return false, nil
	} else if !errors.Is(err, jetstream.ErrMsgNotFound) {
		return false, fmt.Errorf("look up effect of %s: %w", fx.Node, err)
	}
	msg, err := jsonMsg(subject, "effect:"+fx.RunID+":"+fx.Node, fx)
	if err != nil {
		return false, err
	}
	ack, err := e.cfg.JS.PublishMsg(ctx, msg)
	if err != nil {
		return false, fmt.Errorf("apply effect of %s: %w", fx.Node, err)
	}
	return !ack.Duplicate, nil
}

func jsonMsg(subject, msgID string, v any) (*nats.Msg, error) {
	b, err := json.Marshal(v)
	if err != nil {
		return nil, fmt.Errorf("marshal %s: %w", subject, err)
	}
	msg := nats.NewMsg(subject)
	msg.Data = b
	msg.Header.Set(contract.HeaderMsgID, msgID)
	return msg, nil
}
