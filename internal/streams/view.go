package streams

import (
	"context"
	"errors"
	"fmt"

	"github.com/nats-io/nats.go/jetstream"
)

// ViewOptions say which messages View reads.
type ViewOptions struct {
	// Subject filters the messages; "" is every subject (">").
	Subject string
	// FromSeq is the sequence to read at or after; 0 is the stream's
	// first. Ignored when Last is set.
	FromSeq uint64
	// Count is how many messages to read from FromSeq at most.
	Count int
	// Last, when positive, reads the last Last messages on Subject
	// stored when View started, instead of reading from FromSeq.
	Last int
}

// View reads a page of s's messages with message gets (direct gets
// where the stream allows them), oldest first. It creates no consumer:
// the NATS operator user, which may create none (docs/security.md), pages
// a stream this way, and a page read leaves nothing on the server.
func View(ctx context.Context, s jetstream.Stream, o ViewOptions) ([]*jetstream.RawStreamMsg, error) {
	r := viewer{s: s, subject: o.Subject}
	if r.subject == "" {
		r.subject = ">"
	}
	state := s.CachedInfo().State
	if o.Last > 0 {
		if state.Msgs == 0 {
			return nil, nil
		}
		return r.last(ctx, max(state.FirstSeq, 1), state.LastSeq, o.Last)
	}
	var out []*jetstream.RawStreamMsg
	seq := max(o.FromSeq, state.FirstSeq, 1)
	for len(out) < o.Count {
		m, err := r.next(ctx, seq)
		if err != nil || m == nil {
			return out, err
		}
		out = append(out, m)
		seq = m.Sequence + 1
	}
	return out, nil
}

// viewer reads one stream's messages on a subject filter.
type viewer struct {
	s       jetstream.Stream
	subject string
}

// next is the first message on the filter at or after seq; nil when
// there is none.
func (r viewer) next(ctx context.Context, seq uint64) (*jetstream.RawStreamMsg, error) {
	m, err := r.s.GetMsg(ctx, seq, jetstream.WithGetMsgSubject(r.subject))
	if errors.Is(err, jetstream.ErrMsgNotFound) {
		return nil, nil
	}
	if err != nil {
		return nil, fmt.Errorf("get message of %s at or after sequence %d on %s: %w", r.s.CachedInfo().Config.Name, seq, r.subject, err)
	}
	// A direct get answers with where the message is stored in headers
	// of its own; a message get does not. Keep what was published.
	for _, h := range []string{jetstream.StreamHeader, jetstream.SubjectHeader, jetstream.SequenceHeader, jetstream.TimeStampHeaer} {
		m.Header.Del(h)
	}
	return m, nil
}

// last is the last need messages on the filter between lo and hi. A get
// only reads forward, so it halves the range from the top until a part
// is small enough to read whole: about need times the halvings in gets,
// however many messages are stored or however sparse the filter's are.
func (r viewer) last(ctx context.Context, lo, hi uint64, need int) ([]*jetstream.RawStreamMsg, error) {
	if need <= 0 || lo > hi {
		return nil, nil
	}
	first, err := r.next(ctx, lo)
	if err != nil || first == nil || first.Sequence > hi {
		return nil, err
	}
	if hi-first.Sequence < uint64(2*need) {
		msgs := []*jetstream.RawStreamMsg{first}
		for m := first; ; {
			if m, err = r.next(ctx, m.Sequence+1); err != nil || m == nil || m.Sequence > hi {
				return msgs, err
			}
			msgs = append(msgs, m)
			if len(msgs) > need {
				msgs = msgs[1:]
			}
		}
	}
	mid := first.Sequence + (hi-first.Sequence)/2
	upper, err := r.last(ctx, mid+1, hi, need)
	if err != nil || len(upper) == need {
		return upper, err
	}
	lower, err := r.last(ctx, first.Sequence, mid, need-len(upper))
	if err != nil {
		return nil, err
	}
	return append(lower, upper...), nil
}
