package harness

import (
	"context"
	"errors"
	"fmt"
	"sync"
	"testing"
	"time"

	"github.com/nats-io/nats.go"
	"github.com/nats-io/nats.go/jetstream"

	"github.com/retryd/retryd/pkg/contract"
)

// EffectSubjects are the subjects whose messages are effects: due events,
// run requests, admitted events and job messages (every priority band).
var EffectSubjects = []string{"retry.*.due.>", "runs.*.requested.*", "events.>", "jobs.*", "jobs.*.high", "jobs.*.low"}

// WireCounter counts every message published on EffectSubjects by
// Nats-Msg-Id, as a plain NATS subscriber sees them: a publish JetStream
// drops as a duplicate still crosses the wire, so the wire count minus
// the stored count is what deduplication absorbed. A subscriber can miss
// messages while NATS restarts, so the wire count is a lower bound.
type WireCounter struct {
	mu     sync.Mutex
	counts map[string]int
}

// NewWireCounter subscribes on nc.
func NewWireCounter(t testing.TB, nc *nats.Conn) *WireCounter {
	w := &WireCounter{counts: map[string]int{}}
	for _, subj := range EffectSubjects {
		sub, err := nc.Subscribe(subj, func(m *nats.Msg) {
			id := m.Header.Get(contract.HeaderMsgID)
			if id == "" {
				id = "(none):" + m.Subject
			}
			w.mu.Lock()
			w.counts[id]++
			w.mu.Unlock()
		})
		if err != nil {
			t.Fatalf("subscribe %s: %v", subj, err)
		}
		_ = sub.SetPendingLimits(-1, -1)
	}
	return w
}

// Extra sums, over the given ids, the wire copies beyond stored[id]
// (at least one): duplicates absorbed before they were stored.
func (w *WireCounter) Extra(stored map[string]int, ids func(string) bool) int {
	w.mu.Lock()
	defer w.mu.Unlock()
	n := 0
	for id, c := range w.counts {
		if ids != nil && !ids(id) {
			continue
		}
		if s := max(stored[id], 1); c > s {
			n += c - s
		}
	}
	return n
}

// StoredMsg is one message read back from a stream.
type StoredMsg struct {
	Subject string
	MsgID   string
	Seq     uint64
	Data    []byte
	Time    time.Time
}

// SubjectsStored is how many distinct subjects matching filter stream
// holds: for a filter like retry.<kind>.scheduled.>, how many items have
// one. It reads the stream's info, not its messages, so it is cheap to
// poll.
func SubjectsStored(ctx context.Context, js jetstream.JetStream, stream, filter string) (int, error) {
	st, err := js.Stream(ctx, stream)
	if err != nil {
		return 0, fmt.Errorf("read %s: %w", stream, err)
	}
	info, err := st.Info(ctx, jetstream.WithSubjectFilter(filter))
	if err != nil {
		return 0, fmt.Errorf("read %s %s: %w", stream, filter, err)
	}
	return len(info.State.Subjects), nil
}

// Stored reads every message of stream matching filter, in order.
func Stored(ctx context.Context, js jetstream.JetStream, stream, filter string) ([]StoredMsg, error) {
	cons, err := js.CreateConsumer(ctx, stream, jetstream.ConsumerConfig{
		FilterSubject:     filter,
		AckPolicy:         jetstream.AckNonePolicy,
		DeliverPolicy:     jetstream.DeliverAllPolicy,
		InactiveThreshold: time.Minute,
		MemoryStorage:     true,
	})
	if err != nil {
		return nil, fmt.Errorf("read %s %s: %w", stream, filter, err)
	}
	defer func() { _ = js.DeleteConsumer(context.WithoutCancel(ctx), stream, cons.CachedInfo().Name) }()
	info, err := cons.Info(ctx)
	if err != nil {
		return nil, fmt.Errorf("read %s %s: %w", stream, filter, err)
	}
	want := int(info.NumPending)
	out := make([]StoredMsg, 0, want)
	for len(out) < want {
		batch, err := cons.Fetch(min(want-len(out), 2000), jetstream.FetchMaxWait(5*time.Second))
		if err != nil {
			return nil, fmt.Errorf("read %s %s: %w", stream, filter, err)
		}
		n := 0
		for m := range batch.Messages() {
			n++
			md, _ := m.Metadata()
			sm := StoredMsg{Subject: m.Subject(), MsgID: m.Headers().Get(contract.HeaderMsgID), Data: m.Data()}
			if md != nil {
				sm.Seq, sm.Time = md.Sequence.Stream, md.Timestamp
			}
			out = append(out, sm)
		}
		if err := batch.Error(); err != nil && !errors.Is(err, nats.ErrTimeout) {
			return nil, fmt.Errorf("read %s %s: %w", stream, filter, err)
		}
		if n == 0 {
			return nil, fmt.Errorf("read %s %s: got %d of %d messages", stream, filter, len(out), want)
		}
	}
	return out, nil
}

// CountByMsgID counts stored messages per Nats-Msg-Id.
func CountByMsgID(msgs []StoredMsg) map[string]int {
	out := make(map[string]int, len(msgs))
	for _, m := range msgs {
		out[m.MsgID]++
	}
	return out
}

// Duplicates is the number of stored copies beyond the first, over all
// ids: each is an effect a consumer sees twice.
func Duplicates(counts map[string]int) int {
	n := 0
	for _, c := range counts {
		if c > 1 {
			n += c - 1
		}
	}
	return n
}
