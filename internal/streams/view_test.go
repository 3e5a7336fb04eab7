package streams_test

import (
	"fmt"
	"testing"

	"github.com/nats-io/nats.go"
	"github.com/nats-io/nats.go/jetstream"
	"github.com/stretchr/testify/require"

	"github.com/retryd/retryd/internal/streams"
	"github.com/retryd/retryd/pkg/contract"
)

// View pages a stream from a sequence or from its end, on a subject
// filter, with gaps in the sequences, and creates no consumer. RETRIES is
// read with direct gets, EVENTS with message gets: both give the
// published headers alone.
func TestView(t *testing.T) {
	t.Parallel()
	b := setup(t)
	require.NoError(t, streams.Ensure(b.ctx, b.js, streams.Options{}))

	// 300 job facts, with 3 event facts early and 1 late: a sparse
	// filter at both ends.
	var subjects []string
	publish := func(subject string) {
		m := nats.NewMsg(subject)
		m.Header.Set(nats.MsgIdHdr, fmt.Sprintf("id-%d", len(subjects)+1))
		m.Header.Set(contract.HeaderKind, "test")
		m.Data = fmt.Appendf(nil, `{"n":%d}`, len(subjects)+1)
		_, err := b.js.PublishMsg(b.ctx, m)
		require.NoError(t, err)
		subjects = append(subjects, subject)
	}
	for i := range 300 {
		if i == 2 || i == 5 || i == 9 || i == 297 {
			publish(fmt.Sprintf("retry.event.failed.e%d", i))
		}
		publish(fmt.Sprintf("retry.job.failed.j%d", i))
	}
	retries, err := b.js.Stream(b.ctx, contract.StreamRetries)
	require.NoError(t, err)
	require.True(t, retries.CachedInfo().Config.AllowDirect)
	// Gaps: a deleted message, the first one too.
	require.NoError(t, retries.DeleteMsg(b.ctx, 1))
	require.NoError(t, retries.DeleteMsg(b.ctx, 150))
	retries, err = b.js.Stream(b.ctx, contract.StreamRetries)
	require.NoError(t, err)

	// stored are the sequences on a filter, read one by one.
	stored := func(filter string) []uint64 {
		var out []uint64
		for seq, s := range subjects {
			n := uint64(seq + 1)
			if n == 1 || n == 150 {
				continue
			}
			if filter == ">" || (filter == "retry.event.>" && s[:12] == "retry.event.") || (filter == "retry.job.>" && s[:10] == "retry.job.") {
				out = append(out, n)
			}
		}
		return out
	}
	seqs := func(msgs []*jetstream.RawStreamMsg) []uint64 {
		out := []uint64{}
		for _, m := range msgs {
			out = append(out, m.Sequence)
		}
		return out
	}
	window := func(all []uint64, from, n int) []uint64 {
		from, to := min(from, len(all)), min(from+n, len(all))
		return append([]uint64{}, all[from:to]...)
	}

	for _, filter := range []string{">", "retry.event.>", "retry.job.>"} {
		all := stored(filter)
		got, err := streams.View(b.ctx, retries, streams.ViewOptions{Subject: filter, Count: 20})
		require.NoError(t, err)
		require.Equal(t, window(all, 0, 20), seqs(got), "the first page on %s", filter)
		got, err = streams.View(b.ctx, retries, streams.ViewOptions{Subject: filter, FromSeq: 149, Count: 7})
		require.NoError(t, err)
		from := 0
		for from < len(all) && all[from] < 149 {
			from++
		}
		require.Equal(t, window(all, from, 7), seqs(got), "from 149 on %s", filter)
		for _, n := range []int{1, 2, 3, 5, 20, 153, 1000} {
			got, err = streams.View(b.ctx, retries, streams.ViewOptions{Subject: filter, Last: n})
			require.NoError(t, err)
			require.Equal(t, window(all, max(len(all)-n, 0), n), seqs(got), "the last %d on %s", n, filter)
		}
	}
	got, err := streams.View(b.ctx, retries, streams.ViewOptions{Subject: "retry.run.>", Last: 5})
	require.NoError(t, err)
	require.Empty(t, got, "nothing on the filter")
	got, err = streams.View(b.ctx, retries, streams.ViewOptions{FromSeq: 10_000, Count: 5})
	require.NoError(t, err)
	require.Empty(t, got, "past the end")

	// What was published, and nothing of where a direct get found it.
	got, err = streams.View(b.ctx, retries, streams.ViewOptions{Count: 1})
	require.NoError(t, err)
	require.Equal(t, subjects[1], got[0].Subject)
	require.Equal(t, nats.Header{nats.MsgIdHdr: {"id-2"}, contract.HeaderKind: {"test"}}, got[0].Header)
	require.JSONEq(t, `{"n":2}`, string(got[0].Data))
	require.False(t, got[0].Time.IsZero())

	// EVENTS has no direct get: the same through a message get.
	m := nats.NewMsg("events.shop.order")
	m.Header.Set(nats.MsgIdHdr, "evt-1")
	m.Data = []byte(`{"id":"evt-1"}`)
	_, err = b.js.PublishMsg(b.ctx, m)
	require.NoError(t, err)
	events, err := b.js.Stream(b.ctx, contract.StreamEvents)
	require.NoError(t, err)
	require.False(t, events.CachedInfo().Config.AllowDirect)
	got, err = streams.View(b.ctx, events, streams.ViewOptions{Subject: "events.shop.>", Last: 3})
	require.NoError(t, err)
	require.Len(t, got, 1)
	require.Equal(t, nats.Header{nats.MsgIdHdr: {"evt-1"}}, got[0].Header)

	for _, name := range []string{contract.StreamRetries, contract.StreamEvents} {
		s, err := b.js.Stream(b.ctx, name)
		require.NoError(t, err)
		require.Zero(t, s.CachedInfo().State.Consumers, "%s: viewing created no consumer", name)
	}
}
