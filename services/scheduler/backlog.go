package scheduler

import (
	"context"
	"sync"
	"time"

	"github.com/nats-io/nats.go/jetstream"

	"github.com/retryd/retryd/pkg/contract"
)

// A due retry is published again when its owner reported nothing within
// RedueAfter. "Nothing" is only known for the facts the policy stage has
// applied: when it runs behind RETRIES (after a NATS restart, a Postgres
// stall), an owner's succeeded fact can sit stored but unapplied past
// RedueAfter, and a re-emission then, outside the duplicate window, runs
// the retry twice (fault scenario 4 found it at 4 minutes behind). So the
// due loop waits RedueAfter plus the policy stage's lag: the age of the
// newest fact it applied, while the consumer still holds facts it has not.

const (
	// lagCheckEvery bounds the consumer info requests of the due loop.
	lagCheckEvery = time.Second
	// MaxRedueHold caps the lag added to RedueAfter, so an owner that lost
	// its due is served even while the policy stage never catches up.
	MaxRedueHold = time.Hour
)

// applyLag tracks how far the policy stage is behind RETRIES.
type applyLag struct {
	mu sync.Mutex
	// started is when this instance started: before it applied anything,
	// a backlog is at least as old as the instance.
	started time.Time
	// storedAt is the store time of the newest fact applied.
	storedAt time.Time
	// behind is whether the consumer had facts not yet applied (pending or
	// delivered and unacked) when last asked, at checked.
	behind  bool
	checked time.Time
}

func newApplyLag(now time.Time) *applyLag { return &applyLag{started: now} }

// applied records the store time of a fact the policy stage committed.
func (l *applyLag) applied(m jetstream.Msg) {
	md, err := m.Metadata()
	if err != nil {
		return
	}
	l.mu.Lock()
	if md.Timestamp.After(l.storedAt) {
		l.storedAt = md.Timestamp
	}
	l.mu.Unlock()
}

// observe records whether the consumer holds facts not yet applied.
func (l *applyLag) observe(info *jetstream.ConsumerInfo, now time.Time) {
	l.mu.Lock()
	l.behind = info.NumPending > 0 || info.NumAckPending > 0
	l.checked = now
	l.mu.Unlock()
}

// due reports whether the consumer should be asked again.
func (l *applyLag) due(now time.Time) bool {
	l.mu.Lock()
	defer l.mu.Unlock()
	return now.Sub(l.checked) >= lagCheckEvery
}

// at returns the lag at now: 0 when the consumer held nothing unapplied
// when last asked, else the age of the newest applied fact (of the
// instance, before it applied one), at most MaxRedueHold. The store time
// is the NATS server's clock: skew between it and this host shifts the
// figure by the skew.
func (l *applyLag) at(now time.Time) time.Duration {
	l.mu.Lock()
	defer l.mu.Unlock()
	if !l.behind {
		return 0
	}
	since := l.storedAt
	if since.IsZero() {
		since = l.started
	}
	return min(max(now.Sub(since), 0), MaxRedueHold)
}

// redueAfter is RedueAfter plus the policy stage's lag. It asks the
// consumer at most every lagCheckEvery; when that fails (NATS down, and
// then no due is published either), the last answer stands.
func (s *Scheduler) redueAfter(ctx context.Context) time.Duration {
	now := time.Now()
	if s.lag.due(now) {
		c, err := s.cfg.JS.Consumer(ctx, contract.StreamRetries, ConsumerNameOf(s.cfg.Shard))
		if err == nil {
			s.lag.observe(c.CachedInfo(), now)
		} else {
			s.log.Debug().Err(err).Msg("read consumer info for the policy stage lag")
		}
	}
	lag := s.lag.at(now)
	s.metrics.policyLag.Set(lag.Seconds())
	return s.cfg.RedueAfter + lag
}
