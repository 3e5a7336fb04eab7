package worker

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"strconv"
	"sync"
	"sync/atomic"
	"time"

	"github.com/nats-io/nats.go/jetstream"

	"github.com/retryd/retryd/pkg/contract"
	"github.com/retryd/retryd/pkg/owner"
)

// outcomeLookupTimeout bounds the reads of RETRIES that check a replayed
// job for an outcome.
const outcomeLookupTimeout = 5 * time.Second

// recreateTimeout bounds the look-up, stream reads and creation of a
// deleted consumer. Not FetchWait: a short pull wait (tests use 200 ms)
// made a loaded server's create time out after it had created the
// consumer, which then went uncounted.
const recreateTimeout = 5 * time.Second

// pull is one durable pull consumer of the worker and what it takes to
// create it again.
type pull struct {
	stream string
	cfg    jetstream.ConsumerConfig
	// cons is the consumer handle; a band's loop and its idle wait both
	// pull with it, and either may create the consumer again.
	mu   sync.Mutex
	cons jetstream.Consumer
	// replay is set when this worker created the consumer (nil: it
	// existed already). A new consumer delivers the whole stream
	// (DeliverAll); what it held then is checked for an outcome before it
	// runs (see alreadyDone).
	replay atomic.Pointer[replayGuard]
}

// consumer is the handle to pull with.
func (p *pull) consumer() jetstream.Consumer {
	p.mu.Lock()
	defer p.mu.Unlock()
	return p.cons
}

// replayGuard is what a newly created consumer's history is checked with.
type replayGuard struct {
	// until is the stream's last sequence when the consumer was created.
	until uint64
	// retries is where the outcomes are looked up, read once.
	retries jetstream.Stream
}

func (w *Worker) newPull(ctx context.Context, stream string, cfg jetstream.ConsumerConfig) (*pull, error) {
	p := &pull{stream: stream, cfg: cfg}
	_, err := w.cfg.JS.Consumer(ctx, stream, cfg.Durable)
	switch {
	case errors.Is(err, jetstream.ErrConsumerNotFound):
		if err := w.guardReplay(ctx, p); err != nil {
			return nil, fmt.Errorf("start worker: %w", err)
		}
	case err != nil:
		return nil, fmt.Errorf("start worker: look up consumer %s: %w", cfg.Durable, err)
	}
	p.cons, err = w.cfg.JS.CreateOrUpdateConsumer(ctx, stream, cfg)
	if err != nil {
		return nil, fmt.Errorf("start worker: create consumer %s: %w", cfg.Durable, err)
	}
	return p, nil
}

// guardReplay records the stream's last sequence before p's consumer is
// created: what the new consumer delivers up to there is history.
func (w *Worker) guardReplay(ctx context.Context, p *pull) error {
	st, err := w.cfg.JS.Stream(ctx, p.stream)
	if err != nil {
		return fmt.Errorf("read stream %s: %w", p.stream, err)
	}
	retries := st
	if p.stream != contract.StreamRetries {
		if retries, err = w.cfg.JS.Stream(ctx, contract.StreamRetries); err != nil {
			return fmt.Errorf("read stream %s: %w", contract.StreamRetries, err)
		}
	}
	p.replay.Store(&replayGuard{until: st.CachedInfo().State.LastSeq, retries: retries})
	return nil
}

// alreadyDone reports whether msg is history a new consumer replays and
// the job's attempt already has an outcome on RETRIES (succeeded, failed,
// held, exhausted or cancelled, at that attempt or a later one): it is then
// acked without running. Any doubt runs it: at least once.
func (w *Worker) alreadyDone(p *pull, msg jetstream.Msg, id string, attempt int, log *slog.Logger) bool {
	g := p.replay.Load()
	if g == nil {
		return false
	}
	md, err := msg.Metadata()
	if err != nil || md.Sequence.Stream > g.until {
		return false
	}
	// Not the loop's context: a job already handed to a handler slot is
	// checked even while the worker stops.
	ctx, cancel := context.WithTimeout(context.Background(), outcomeLookupTimeout)
	defer cancel()
	for _, ev := range []contract.Lifecycle{contract.Succeeded, contract.Failed, contract.Held, contract.Exhausted, contract.Cancelled} {
		m, err := owner.LastFact(ctx, g.retries, contract.RetrySubject(contract.KindJob, ev, id))
		if errors.Is(err, jetstream.ErrMsgNotFound) {
			continue
		}
		if err != nil {
			log.Warn("replayed job: cannot check for an outcome; running it", slog.Any("error", err))
			return false
		}
		if n, err := strconv.Atoi(m.Header.Get(contract.HeaderAttempt)); err == nil && n >= attempt {
			w.m.replaySkipped.Inc()
			log.Info("replayed job already has an outcome; acked without running", slog.String("outcome", string(ev)))
			return true
		}
	}
	return false
}

// recreateIfDeleted runs after a failed pull. A consumer deleted under the
// worker (`nats consumer rm`, a stream restored from a backup) answers
// every pull with "no responders"; the worker creates it again with its
// configuration, so jobs keep running without a restart. A missing stream
// is left to the scheduler's reconciliation or the operator: the worker
// does not own streams, and tries again at its next failed pull. The new
// consumer delivers the stream from its start (DeliverAll), so nothing
// published meanwhile is lost; what was there before is checked for an
// outcome and not run twice (alreadyDone).
func (w *Worker) recreateIfDeleted(p *pull, log *slog.Logger) {
	ctx, cancel := context.WithTimeout(w.loopCtx, recreateTimeout)
	defer cancel()
	_, err := w.cfg.JS.Consumer(ctx, p.stream, p.cfg.Durable)
	if !errors.Is(err, jetstream.ErrConsumerNotFound) {
		return
	}
	if err := w.guardReplay(ctx, p); err != nil {
		log.Warn("consumer missing; cannot read its stream, trying at the next pull", slog.Any("error", err))
		return
	}
	cons, err := w.cfg.JS.CreateOrUpdateConsumer(ctx, p.stream, p.cfg)
	if err != nil {
		log.Warn("consumer missing; creating it again failed, trying at the next pull", slog.Any("error", err), slog.String("stream", p.stream))
		return
	}
	p.mu.Lock()
	p.cons = cons
	p.mu.Unlock()
	w.m.recreated.Inc()
	log.Warn("consumer was deleted; created it again", slog.String("stream", p.stream))
}
