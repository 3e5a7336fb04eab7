package scheduler

import (
	"context"
	"errors"
	"fmt"
	"time"

	"github.com/jackc/pgx/v5"

	"github.com/retryd/retryd/pkg/contract"
	"github.com/retryd/retryd/stores/retrystore"
)

// releaseLead is how long before its first row's slot a part of a
// release is applied when the scheduler emits the rows' dues: the lead
// covers the due loop's quantum and a busy moment.
const releaseLead = time.Second

// releaseBehindMargin: a release the owner admits runs behind only when
// no row of it would come due on its own until this long after its part.
const releaseBehindMargin = time.Minute

// releasePollMax caps the release loop's sleep: another instance may
// record a release with parts left without waking this one.
const releasePollMax = 5 * time.Second

// releaseBusyWait is the least the release loop sleeps between looks.
const releaseBusyWait = 20 * time.Millisecond

// releaseFirstPart starts release rd (of every hold of its key). It
// supersedes the parts left of earlier releases of the key that rd covers.
//
// A release the owner admits itself (owner_admits) asks the scheduler
// only for a fallback: a due RedueAfter after each item's slot, in case
// the owner never answers. Its parts then run behind the owner, half of
// RedueAfter after their slots: by then the owner has admitted the rows
// and its succeeded facts have closed them (a close of a held row records
// the release, decided_by resume), and a part writes only the rows left.
// Writing every row ahead of the owner, 100,000 updates and history rows
// for a release of that size, took the machine the owner admits with
// (docs/benchmarks.md, section 7). It runs ahead instead when a row
// would come due on its own before its part (a pause until soon, a
// throttle's slot).
//
// Otherwise the first part is applied in tx and the rest a little before
// their slots. more reports that parts are left.
func (s *Scheduler) releaseFirstPart(ctx context.Context, tx pgx.Tx, msgID string, rd contract.ReleasedData) (retrystore.Released, bool, error) {
	if err := retrystore.SupersedeReleaseParts(ctx, tx, rd); err != nil {
		return retrystore.Released{}, false, err
	}
	if rd.OwnerAdmits {
		n, earliest, err := retrystore.ReleaseExtent(ctx, tx, rd)
		if err != nil {
			return retrystore.Released{}, false, err
		}
		if n == 0 {
			return retrystore.Released{}, false, nil
		}
		last := s.behindAt(rd, n-1)
		if earliest == nil || earliest.After(last.Add(releaseBehindMargin)) {
			first := s.behindAt(rd, 0)
			err := retrystore.SaveReleasePart(ctx, tx, msgID, rd, retrystore.ReleaseCursor{}, true, &first)
			return retrystore.Released{}, err == nil, err
		}
	}
	return s.releasePart(ctx, tx, msgID, rd, retrystore.ReleaseCursor{}, false)
}

// releasePart applies the part of release rd that follows cur in tx and
// records where it stopped and when its next part is due, or forgets the
// release when this part found the last rows. more reports parts left.
func (s *Scheduler) releasePart(ctx context.Context, tx pgx.Tx, msgID string, rd contract.ReleasedData, cur retrystore.ReleaseCursor,
	behind bool) (rel retrystore.Released, more bool, err error) {
	rel, err = retrystore.ReleaseHoldsPart(ctx, tx, msgID, rd, s.cfg.RedueAfter, cur, s.cfg.ReleasePart)
	if err != nil {
		return retrystore.Released{}, false, err
	}
	if rel.Ranked < int64(s.cfg.ReleasePart) {
		return rel, false, retrystore.FinishReleaseParts(ctx, tx, msgID)
	}
	return rel, true, retrystore.SaveReleasePart(ctx, tx, msgID, rd, rel.Cursor, behind, s.nextPartAt(rd, rel.Cursor, behind))
}

// slotOf is when the owner admits the item of rank i (from 0) of rd: its
// slot of the pace, or at once.
func slotOf(rd contract.ReleasedData, i int64) time.Time {
	if rd.Pace == nil {
		return rd.ReleasedAt
	}
	return rd.Pace.SlotAt(int(i))
}

// behindAt is when the part of a release running behind its owner that
// starts at rank i (from 0) is due.
func (s *Scheduler) behindAt(rd contract.ReleasedData, i int64) time.Time {
	return slotOf(rd, i).Add(s.cfg.RedueAfter / 2)
}

// nextPartAt is when the part after cur is due: behind its owner, or
// releaseLead before its first row's slot when rd is paced, at once (nil)
// when it is not. Behind, a part ranks only the rows not closed yet, so
// cur.Numbered falls behind the owner's line and the next part is due
// early: the parts then run one after the other, each giving fallbacks
// later than the owner's slots.
func (s *Scheduler) nextPartAt(rd contract.ReleasedData, cur retrystore.ReleaseCursor, behind bool) *time.Time {
	if behind {
		at := s.behindAt(rd, cur.Numbered)
		return &at
	}
	if rd.Pace == nil {
		return nil
	}
	at := rd.Pace.SlotAt(int(cur.Numbered)).Add(-releaseLead)
	return &at
}

func (s *Scheduler) wakeReleaseLoop() {
	select {
	case s.releaseWake <- struct{}{}:
	default:
	}
}

// runReleaseLoop applies the parts of releases that are due, one part per
// transaction, and sleeps until the next is due. A part and where it
// stopped commit together: a crash resumes at the next part.
func (s *Scheduler) runReleaseLoop(ctx context.Context) {
	for {
		wait := releasePollMax
		for ctx.Err() == nil {
			applied, err := s.applyReleasePart(ctx)
			if err != nil {
				if ctx.Err() == nil {
					s.metrics.errors.WithLabelValues("release").Inc()
					s.log.Error().Err(err).Msg("apply release part failed, trying again")
				}
				wait = time.Second
				break
			}
			if !applied {
				d, ok, err := retrystore.NextReleasePartIn(ctx, s.cfg.Pool)
				if err == nil && ok {
					// A part due now that could not be claimed is another
					// instance's: look again shortly rather than spin.
					wait = min(max(d, releaseBusyWait), releasePollMax)
				}
				break
			}
		}
		t := time.NewTimer(wait)
		select {
		case <-ctx.Done():
			t.Stop()
			return
		case <-s.releaseWake:
			t.Stop()
		case <-t.C:
		}
	}
}

// applyReleasePart applies the part of the release due the earliest, if
// one is due; applied reports whether one was.
func (s *Scheduler) applyReleasePart(ctx context.Context) (applied bool, err error) {
	tx, err := s.begin(ctx)
	if err != nil {
		return false, err
	}
	defer tx.Rollback(context.WithoutCancel(ctx)) //nolint:errcheck // no-op after commit
	p, err := retrystore.ClaimReleasePart(ctx, tx)
	var bad *retrystore.MalformedReleaseError
	if errors.As(err, &bad) {
		// Left in place it would be claimed first again and again, and
		// every release behind it would wait.
		if err := retrystore.FinishReleaseParts(ctx, tx, bad.MsgID); err != nil {
			return false, err
		}
		if err := tx.Commit(ctx); err != nil {
			return false, fmt.Errorf("commit drop of release %s: %w", bad.MsgID, err)
		}
		s.metrics.malformed.WithLabelValues("release").Inc()
		s.log.Error().Err(err).Str("msg_id", bad.MsgID).Msg("dropped a release part that cannot be decoded")
		return true, nil
	}
	if err != nil || p == nil {
		return false, err
	}
	rd := p.Release
	rel, more, err := s.releasePart(ctx, tx, p.MsgID, rd, p.Cursor, p.Behind)
	if err != nil {
		return false, err
	}
	if err := s.cfg.Failpoint.At(ctx, FailpointReleasePart); err != nil {
		return false, err
	}
	if err := tx.Commit(ctx); err != nil {
		return false, fmt.Errorf("commit release part: %w", err)
	}
	if rel.Rows > 0 {
		s.wakeDueLoop(rel.First.UnixNano())
	}
	if !more {
		s.log.Info().Str("kind", rd.Kind).Str("hold_key", rd.HoldKey).Int64("released", rel.Cursor.Numbered).
			Bool("behind_owner", p.Behind).Str("reason", rd.Reason).Msg("holds released")
	}
	return true, nil
}
