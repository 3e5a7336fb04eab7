package ingress

import (
	"context"
	"fmt"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/nats-io/nats.go"

	"github.com/retryd/retryd/internal/outbox"
	"github.com/retryd/retryd/services/ingress/internal/ingressstore"
)

// The releaser admits the release lines (ingressstore.PaceRelease) itself,
// in batches, rather than one due per event through the scheduler: a due
// costs a scheduler emission and a gate transaction per event, which on
// two cores capped a release near 1,500 events a second.
const (
	// releaseBatch is the most events one transaction admits.
	releaseBatch = 1000
	// releaseTick is the shortest pause between two batches while a line
	// has events whose slots are still to come: slots a few microseconds
	// apart are admitted together, not one transaction each. At 10 ms a
	// release paced at 10,000/s took 100 transactions (and relay passes)
	// a second; at 25 ms, 40 of about 250 events (bench run H3).
	releaseTick = 25 * time.Millisecond
	// releasePoll is how often an idle releaser looks for a line another
	// instance's release started.
	releasePoll = time.Second
	// maxLineWait bounds how long a due for an event in a release line is
	// handed back for at a time: it looks again at least this often.
	maxLineWait = time.Minute
)

// releaseLoop admits the events of release lines at their slots until ctx
// ends. A resume or a limit change on this instance wakes it at once
// (kickRelease); lines started elsewhere are found within releasePoll.
func (s *Service) releaseLoop(ctx context.Context) {
	timer := time.NewTimer(0)
	defer timer.Stop()
	for {
		select {
		case <-ctx.Done():
			return
		case <-s.releaseKick:
		case <-timer.C:
		}
		wait, err := s.releaseDue(ctx)
		if err != nil {
			if ctx.Err() != nil {
				return
			}
			s.log.Warn().Err(err).Msg("release line: admitting failed; trying again")
			wait = releasePoll
		}
		timer.Reset(wait)
	}
}

// kickRelease wakes the releaser after a commit that started a line.
func (s *Service) kickRelease() {
	select {
	case s.releaseKick <- struct{}{}:
	default:
	}
}

// releaseDue admits every event whose slot has come and whose window has
// room, a batch per transaction, and returns how long to wait before a
// line can move again.
func (s *Service) releaseDue(ctx context.Context) (time.Duration, error) {
	// Until a pass admits nothing: a pass takes one line, as far as its
	// window's room allows.
	for {
		n, err := s.admitReleased(ctx)
		if err != nil {
			return 0, err
		}
		if n == 0 {
			break
		}
	}
	next, ok, err := ingressstore.NextReleaseSlot(ctx, s.cfg.Pool)
	switch {
	case err != nil:
		return 0, err
	case !ok:
		return releasePoll, nil
	}
	return min(max(next, releaseTick), releasePoll), nil
}

// admitReleased admits one batch of a release line in one transaction:
// the events, their succeeded facts and their rate window counts commit
// together, so a crash admits the whole batch or none of it, and the
// next pass (of any instance) takes up the line where it stands.
func (s *Service) admitReleased(ctx context.Context) (int, error) {
	var batch []ingressstore.Released
	err := s.inTx(ctx, func(tx pgx.Tx) error {
		var err error
		if batch, err = ingressstore.AdmitReleased(ctx, tx, releaseBatch); err != nil || len(batch) == 0 {
			return err
		}
		now := s.cfg.Now()
		msgs := make([]*nats.Msg, 0, 2*len(batch))
		for _, ev := range batch {
			msgs = append(msgs, eventMsg(ev.ID, ev.Source, ev.Type, ev.Envelope))
		}
		// The events first, in line order: the relay publishes in insert
		// order, so consumers see the admissions in arrival order.
		for _, ev := range batch {
			if ev.Attempt == 0 {
				continue
			}
			m, err := succeededMsg(ev.ID, ev.Source, ev.Attempt, now)
			if err != nil {
				return fmt.Errorf("build succeeded of %s: %w", ev.ID, err)
			}
			msgs = append(msgs, m)
		}
		return outbox.Insert(ctx, tx, OutboxOwner, msgs...)
	})
	if err != nil || len(batch) == 0 {
		return 0, err
	}
	if err := s.cfg.Failpoint.At(ctx, FailpointReleaseCommitted); err != nil {
		return 0, err
	}
	s.relay.Kick()
	s.reportReleased(batch)
	return len(batch), nil
}

// reportReleased counts a committed batch and logs it at debug: a paced
// release commits a batch every releaseTick, too often for info (the
// release itself is logged at info when it is made).
func (s *Service) reportReleased(batch []ingressstore.Released) {
	per := map[string]int{}
	for _, ev := range batch {
		per[ev.Source]++
		label := s.metrics.sources.label(ev.Source)
		s.metrics.gate.WithLabelValues(label, decisionAdmitted).Inc()
		if ev.Attempt > 0 {
			s.metrics.retry(ev.Source, retryCompleted)
		}
		s.log.Debug().Str("source", ev.Source).Str("event_id", ev.ID).Int("attempt", ev.Attempt).Msg("released event admitted")
	}
	for source, n := range per {
		s.log.Debug().Str("source", source).Int("admitted", n).Msg("release line: events admitted")
	}
}
