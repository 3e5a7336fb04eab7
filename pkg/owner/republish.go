package owner

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"strconv"
	"time"

	"github.com/nats-io/nats.go"
	"github.com/nats-io/nats.go/jetstream"

	"github.com/retryd/retryd/pkg/contract"
)

// checkTimeout bounds one check of a pending fact: its reads of RETRIES
// and its republish.
const checkTimeout = 5 * time.Second

// decisionEvents are the scheduler's answers to a failed or held fact.
var decisionEvents = []contract.Lifecycle{contract.Scheduled, contract.Rescheduled, contract.Exhausted, contract.Cancelled}

// republishWindow is the wait before a pending fact is checked. It must
// outlast the stream's duplicate window: a purge does not clear
// JetStream's record of the Nats-Msg-Ids it stored, so a copy published
// inside the window would be dropped as a duplicate of the purged one.
func republishWindow(configured, duplicates time.Duration) (time.Duration, error) {
	if configured == 0 {
		return max(DefaultRepublishAfter, duplicates+time.Minute), nil
	}
	if configured <= duplicates {
		return 0, fmt.Errorf("Config.RepublishAfter must be longer than the %s duplicate window of %s (a copy published inside it is dropped as a duplicate), got %s",
			contract.StreamRetries, duplicates, configured)
	}
	return configured, nil
}

// republishLoop checks the pending facts every quarter of the wait until
// ctx ends; each fact is checked one wait after its publish, then every
// wait while it stays undecided.
func (r *Reporter) republishLoop(ctx context.Context) {
	defer close(r.loopDone)
	t := time.NewTicker(r.wait / 4)
	defer t.Stop()
	for {
		select {
		case <-t.C:
			r.checkPending(ctx)
		case <-ctx.Done():
			return
		}
	}
}

// checkPending checks every pending fact that is due.
func (r *Reporter) checkPending(loopCtx context.Context) {
	for _, f := range r.pending.due(r.cfg.Now()) {
		if loopCtx.Err() != nil {
			return
		}
		ctx, cancel := context.WithTimeout(loopCtx, checkTimeout)
		err := r.checkFact(ctx, f)
		cancel()
		if err != nil && loopCtx.Err() == nil {
			// RETRIES unreachable or missing: every other fact would fail
			// the same way; try them all at the next tick.
			r.log.Warn("cannot check a pending fact; trying at the next check", slog.String("id", f.id), slog.Int("attempt", f.attempt), slog.Any("error", err))
			return
		}
	}
}

// checkFact looks for f's decision on RETRIES and drops f when it is
// there. Otherwise a copy of f still in the stream will be read by the
// scheduler, so f keeps waiting; a fact gone from the stream (purged, aged
// out, deleted) is published again with its Nats-Msg-Id: the scheduler's
// inbox recognises a copy it has read already.
func (r *Reporter) checkFact(ctx context.Context, f pendingFact) error {
	seq, stored, decided, err := storedCopy(ctx, r.retries, f)
	if err != nil {
		return err
	}
	if !decided {
		if decided, err = decisionStored(ctx, r.retries, r.cfg.Kind, f); err != nil {
			return err
		}
	}
	if decided || stored {
		r.pending.checked(f, decided, seq)
		return nil
	}
	msg := &nats.Msg{Subject: f.subject, Header: f.header, Data: f.data}
	ack, err := r.cfg.JS.PublishMsg(ctx, msg)
	if err != nil {
		return fmt.Errorf("republish %s: %w", f.event, err)
	}
	r.pending.checked(f, false, ack.Sequence)
	if !ack.Duplicate {
		r.cfg.Metrics.Republished.WithLabelValues(string(f.event)).Inc()
	}
	r.log.Info("fact was gone from the stream before its decision; published it again",
		slog.String("id", f.id), slog.Int("attempt", f.attempt), slog.String("event", string(f.event)),
		slog.Uint64("stream_seq", ack.Sequence), slog.Bool("duplicate", ack.Duplicate))
	return nil
}

// storedCopy reports whether a copy of f is in the stream, and its
// sequence. It reads the last message on f's subject (an owner's
// permissions allow reading its kind's lifecycle subjects, not any
// sequence) and
// compares its Nats-Msg-Id. A message of a later attempt there means f
// was decided (later is set).
func storedCopy(ctx context.Context, retries jetstream.Stream, f pendingFact) (seq uint64, stored, later bool, err error) {
	m, err := LastFact(ctx, retries, f.subject)
	if errors.Is(err, jetstream.ErrMsgNotFound) {
		return 0, false, false, nil
	}
	if err != nil {
		return 0, false, false, fmt.Errorf("read %s: %w", f.subject, err)
	}
	if m.Header.Get(contract.HeaderMsgID) == f.msgID {
		return m.Sequence, true, false, nil
	}
	a, convErr := strconv.Atoi(m.Header.Get(contract.HeaderAttempt))
	return 0, false, convErr == nil && a > f.attempt, nil
}

// decisionStored reports whether RETRIES holds a decision of f: it covers
// a decision published while the owner's subscription missed it (a
// reconnect, a full buffer).
func decisionStored(ctx context.Context, retries jetstream.Stream, kind string, f pendingFact) (bool, error) {
	for _, ev := range decisionEvents {
		subj := contract.RetrySubject(kind, ev, f.id)
		m, err := LastFact(ctx, retries, subj)
		if errors.Is(err, jetstream.ErrMsgNotFound) {
			continue
		}
		if err != nil {
			return false, fmt.Errorf("read %s: %w", subj, err)
		}
		if a, err := strconv.Atoi(m.Header.Get(contract.HeaderAttempt)); err == nil && decides(ev, a, f.attempt, false) {
			return true, nil
		}
	}
	return false, nil
}

// LastFact reads the last message published on subject, a four-token
// RETRIES subject: as stored unsplit, or with the shard token a split
// stream appends (contract.RetryShardTransform). A stream split while
// the item was pending holds both, so both are read and the later wins.
func LastFact(ctx context.Context, retries jetstream.Stream, subject string) (*jetstream.RawStreamMsg, error) {
	m, err := retries.GetLastMsgForSubject(ctx, subject)
	if err != nil && !errors.Is(err, jetstream.ErrMsgNotFound) {
		return nil, err
	}
	split, err2 := retries.GetLastMsgForSubject(ctx, subject+".*")
	switch {
	case err2 != nil && !errors.Is(err2, jetstream.ErrMsgNotFound):
		return nil, err2
	case err2 != nil:
		return m, err
	case m == nil || split.Sequence > m.Sequence:
		return split, nil
	}
	return m, nil
}
