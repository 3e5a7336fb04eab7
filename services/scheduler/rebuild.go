package scheduler

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgxpool"
	"github.com/nats-io/nats.go/jetstream"
	"github.com/prometheus/client_golang/prometheus"
	"github.com/rs/zerolog"

	"github.com/retryd/retryd/internal/inbox"
	"github.com/retryd/retryd/internal/outbox"
	"github.com/retryd/retryd/pkg/contract"
	"github.com/retryd/retryd/pkg/errclass"
	"github.com/retryd/retryd/pkg/tracing"
	"github.com/retryd/retryd/stores/retrystore"
)

// ErrNotEmpty is returned by Rebuild when the projection already holds
// retries or history.
var ErrNotEmpty = errors.New("retry projection is not empty")

// rebuildBatch is the number of messages applied per transaction.
const rebuildBatch = 500

// RebuildStats counts what a rebuild read and did.
type RebuildStats struct {
	// Messages read from RETRIES.
	Messages int `json:"messages"`
	// Applied changed the projection; Stale and Duplicates did not.
	Applied    int `json:"applied"`
	Stale      int `json:"stale"`
	Duplicates int `json:"duplicates"`
	Malformed  int `json:"malformed"`
	// OtherShards counts facts of items another shard owns (WithShard).
	OtherShards int `json:"other_shards,omitempty"`
	// Decided counts failures whose decision was not in the stream and was
	// made by the rebuild (published through the outbox).
	Decided int `json:"decided"`
	// Retries is the number of rows at the end.
	Retries int64 `json:"retries"`
}

// RebuildOption changes how Rebuild decides for failures whose decision
// is missing from the stream.
type RebuildOption func(*rebuildOptions)

type rebuildOptions struct {
	classifier    *errclass.Classifier
	shard, shards int
}

// WithShard rebuilds the projection of one shard of a RETRIES split into
// shards: the facts of the items contract.Shard places on it, whatever
// layout stored them (before the split, or before a resharding), and
// every release.
func WithShard(shard, shards int) RebuildOption {
	return func(o *rebuildOptions) { o.shard, o.shards = shard, shards }
}

// WithClassifier sets the classifier for failures without a class; use the
// scheduler's (default errclass.DefaultClassifier()).
func WithClassifier(c *errclass.Classifier) RebuildOption {
	return func(o *rebuildOptions) { o.classifier = c }
}

// Rebuild replays the RETRIES stream from its first message into an empty
// projection (retries and retry_history), as the scheduler would have
// built it: owners' facts are applied with the same guards, the
// scheduler's own decisions and due emissions are read back. Failures
// whose decision never reached the stream are decided now and their
// events published through the outbox. Messages of every consumed kind are
// also claimed in the inbox, so the live consumer treats them as
// duplicates. Run it with the schedulers stopped.
func Rebuild(ctx context.Context, js jetstream.JetStream, pool *pgxpool.Pool, log zerolog.Logger, opts ...RebuildOption) (RebuildStats, error) {
	o := rebuildOptions{classifier: errclass.DefaultClassifier()}
	for _, opt := range opts {
		opt(&o)
	}
	var stats RebuildStats
	retries, history, err := retrystore.Count(ctx, pool)
	if err != nil {
		return stats, err
	}
	if retries > 0 || history > 0 {
		return stats, fmt.Errorf("rebuild: %d retries and %d history rows: %w", retries, history, ErrNotEmpty)
	}
	stream, err := js.Stream(ctx, contract.StreamRetries)
	if err != nil {
		return stats, fmt.Errorf("rebuild: open stream %s: %w", contract.StreamRetries, err)
	}
	info, err := stream.Info(ctx)
	if err != nil {
		return stats, fmt.Errorf("rebuild: stream info: %w", err)
	}
	last := info.State.LastSeq
	log.Info().Uint64("first_seq", info.State.FirstSeq).Uint64("last_seq", last).Uint64("messages", info.State.Msgs).Msg("rebuild started")

	conn, err := pool.Acquire(ctx)
	if err != nil {
		return stats, fmt.Errorf("rebuild: acquire connection: %w", err)
	}
	defer conn.Release()
	// Scheduler facts carry deterministic ids: a copy republished after
	// the duplicate window is skipped by id. Dues are the exception: a
	// re-emission reuses its id on purpose and counts.
	if _, err := conn.Exec(ctx, `CREATE TEMP TABLE IF NOT EXISTS rebuild_seen (msg_id text PRIMARY KEY)`); err != nil {
		return stats, fmt.Errorf("rebuild: create temp table: %w", err)
	}
	defer conn.Exec(context.WithoutCancel(ctx), `DROP TABLE IF EXISTS rebuild_seen`) //nolint:errcheck // session table

	if err := contract.ValidateShards("shards", o.shards, "shard", o.shard); err != nil {
		return stats, fmt.Errorf("rebuild: %w", err)
	}
	rb := &rebuilder{conn: conn.Conn(), classifier: o.classifier, stats: &stats, undo: map[retrystore.Key]undoFailure{},
		late: map[retrystore.Key]int{}, shard: o.shard, shards: o.shards}
	if last > 0 {
		if err := rb.replay(ctx, js, last); err != nil {
			return stats, err
		}
	}
	if err := rb.decideAwaiting(ctx); err != nil {
		return stats, err
	}
	relay, err := outbox.NewRelay(outbox.RelayConfig{Pool: pool, JS: js, Owner: Owner, Logger: log, Batch: rebuildBatch,
		Interval: time.Second, Registerer: prometheus.NewRegistry()})
	if err != nil {
		return stats, fmt.Errorf("rebuild: %w", err)
	}
	if _, err := relay.Flush(ctx); err != nil {
		return stats, fmt.Errorf("rebuild: flush outbox: %w", err)
	}
	if stats.Retries, _, err = retrystore.Count(ctx, pool); err != nil {
		return stats, err
	}
	log.Info().Int("messages", stats.Messages).Int("applied", stats.Applied).Int("stale", stats.Stale).
		Int("duplicates", stats.Duplicates).Int("malformed", stats.Malformed).Int("decided", stats.Decided).
		Int64("retries", stats.Retries).Msg("rebuild finished")
	return stats, nil
}

type rebuilder struct {
	conn       *pgx.Conn
	classifier *errclass.Classifier
	stats      *RebuildStats
	// undo holds, per item whose failure is recorded but not decided yet,
	// the row before the failure. Entries live from a failure to its
	// decision, so the map holds the failures in flight, not the items.
	undo map[retrystore.Key]undoFailure
	// late holds, per item a due moved to an attempt whose decision was
	// not read yet, that attempt: the decision follows in the stream
	// (replayLateDecision). Entries live from such a due to the item's
	// next decision.
	late map[retrystore.Key]int
	// shard of shards: facts of items on other shards are skipped.
	shard, shards int
}

type undoFailure struct {
	prev  *retrystore.Retry
	msgID string
}

// replay reads the stream up to sequence last with an ordered consumer and
// applies it in batches.
func (rb *rebuilder) replay(ctx context.Context, js jetstream.JetStream, last uint64) error {
	cons, err := js.OrderedConsumer(ctx, contract.StreamRetries, jetstream.OrderedConsumerConfig{
		FilterSubjects: []string{"retry.>"}, DeliverPolicy: jetstream.DeliverAllPolicy,
	})
	if err != nil {
		return fmt.Errorf("rebuild: ordered consumer: %w", err)
	}
	for {
		batch, err := cons.Fetch(rebuildBatch, jetstream.FetchMaxWait(2*time.Second))
		if err != nil {
			return fmt.Errorf("rebuild: fetch: %w", err)
		}
		var items []inbound
		var seq uint64
		for m := range batch.Messages() {
			rb.stats.Messages++
			if md, err := m.Metadata(); err == nil {
				seq = md.Sequence.Stream
			}
			if in, ok := decodeReplay(m); ok {
				if in.f.ev.Event != contract.Released && contract.Shard(in.f.ev.Kind, in.f.ev.ID, rb.shards) != rb.shard {
					rb.stats.OtherShards++
					continue
				}
				items = append(items, in)
			} else {
				rb.stats.Malformed++
			}
		}
		if err := batch.Error(); err != nil && !errors.Is(err, context.DeadlineExceeded) && !errors.Is(err, jetstream.ErrNoMessages) {
			return fmt.Errorf("rebuild: fetch: %w", err)
		}
		if err := rb.applyBatch(ctx, items); err != nil {
			return err
		}
		if seq >= last || (len(items) == 0 && seq == 0) {
			return nil
		}
	}
}

func decodeReplay(m jetstream.Msg) (inbound, bool) {
	ev, err := contract.DecodeLifecycle(m.Subject(), m.Data())
	if err == nil {
		// What the live consumer terminates, a rebuild skips.
		err = contract.CheckLifecycleHeaders(m.Headers(), ev)
	}
	if err != nil {
		return inbound{}, false
	}
	return inbound{msg: m, f: newFact(ev, ev.Envelope.ID)}, true
}

func (rb *rebuilder) applyBatch(ctx context.Context, items []inbound) error {
	if len(items) == 0 {
		return nil
	}
	tx, err := rb.conn.Begin(ctx)
	if err != nil {
		return fmt.Errorf("rebuild: begin: %w", err)
	}
	defer tx.Rollback(context.WithoutCancel(ctx)) //nolint:errcheck // no-op after commit
	for _, in := range items {
		// A replayed decision stores the trace context its message
		// carries, as the original decision stored its own.
		mctx := tracing.WithTraceparent(ctx, in.msg.Headers().Get("traceparent"))
		if err := rb.apply(mctx, tx, in.f); err != nil {
			return fmt.Errorf("rebuild: apply %s %s/%s: %w", in.f.ev.Event, in.f.ev.Kind, in.f.ev.ID, err)
		}
	}
	if err := tx.Commit(ctx); err != nil {
		return fmt.Errorf("rebuild: commit: %w", err)
	}
	return nil
}

func (rb *rebuilder) apply(ctx context.Context, tx pgx.Tx, f fact) error {
	ev := f.ev
	if ev.Event != contract.Due {
		tag, err := tx.Exec(ctx, `INSERT INTO rebuild_seen (msg_id) VALUES ($1) ON CONFLICT DO NOTHING`, f.msgID)
		if err != nil {
			return err
		}
		if tag.RowsAffected() == 0 {
			rb.stats.Duplicates++
			return nil
		}
	}
	switch ev.Event {
	case contract.Failed, contract.Succeeded, contract.Cancelled, contract.Held, contract.Released:
		if _, err := inbox.Claim(ctx, tx, Owner, f.msgID); err != nil {
			return err
		}
	}
	if rd := ev.Released; rd != nil {
		// As live: remembered for later holds, and the holds recorded so
		// far come due (their dues, if the stream has them, follow).
		// A hold decided before this release and applied after it is
		// released as it is applied. For a partial release (a freed slot)
		// that may release one more than the count: it looks again and
		// waits again, which costs a due and no retry, where missing it
		// would leave it waiting for its backoff.
		if err := retrystore.RecordRelease(ctx, tx, rd.Kind, rd.HoldKey, rd.HoldReason, rd.ReleasedAt); err != nil {
			return err
		}
		if _, err := retrystore.ReleaseHolds(ctx, tx, f.msgID, *rd, DefaultRedueAfter); err != nil {
			return err
		}
		rb.stats.Applied++
		return nil
	}
	row, err := lockRow(ctx, tx, ev.Kind, ev.ID)
	if err != nil {
		return err
	}
	key := retrystore.Key{Kind: ev.Kind, ItemID: ev.ID}
	if u, ok := rb.undo[key]; ok && awaitingDecision(row) && overtookFailure(f) {
		if row, err = rb.undoFailure(ctx, tx, key, u); err != nil {
			return err
		}
	}
	var ch change
	lateDecision := false
	hd, held := heldFact(f)
	switch {
	case held:
		if !acceptsFailure(row, hd.Attempt) {
			ch = staleChange()
			break
		}
		r, h := recordHold(row, f, hd)
		ch = change{row: &r, history: []retrystore.HistoryEntry{h}}
		rb.undo[key] = undoFailure{prev: row, msgID: f.msgID}
	case ev.Event == contract.Failed:
		if !acceptsFailure(row, ev.Failed.Attempt) {
			ch = staleChange()
			break
		}
		r, h := recordFailure(row, f, string(classify(rb.classifier, ev.Failed.Error)))
		ch = change{row: &r, history: []retrystore.HistoryEntry{h}}
		rb.undo[key] = undoFailure{prev: row, msgID: f.msgID}
	case ev.Event == contract.Scheduled || ev.Event == contract.Rescheduled:
		ch = replayScheduled(row, f)
		if attempt, ok := rb.late[key]; ch.stale && ok && attempt == ev.Scheduled.Attempt {
			ch, lateDecision = replayLateDecision(row, f), true
		}
	case ev.Event == contract.Exhausted:
		ch = replayExhausted(row, f)
	case ev.Event == contract.Due:
		ch = replayDue(row, f)
		if !ch.stale && (row == nil || ev.Due.Attempt > row.Attempt) {
			rb.late[key] = ev.Due.Attempt
		}
	case ev.Event == contract.Succeeded:
		ch = applySucceeded(row, f)
	case ev.Event == contract.Cancelled:
		ch = applyCancelled(row, f)
	}
	switch {
	case ch.stale:
		rb.stats.Stale++
		return nil
	case ch.untracked:
		return nil
	}
	rb.stats.Applied++
	switch {
	case lateDecision && awaitingDecision(row):
		// The failure awaiting its decision is a later one; it stays
		// undoable.
	case ev.Event != contract.Failed && ev.Event != contract.Held:
		delete(rb.undo, key) // decided, or closed
	}
	switch ev.Event {
	case contract.Scheduled, contract.Rescheduled, contract.Exhausted:
		delete(rb.late, key)
	}
	if err := write(ctx, tx, ch); err != nil {
		return err
	}
	// The decision's class wins over this rebuild's classifier, which may
	// be configured differently from the scheduler that decided.
	if ch.row != nil && (ev.Event == contract.Scheduled || ev.Event == contract.Rescheduled || ev.Event == contract.Exhausted) {
		return retrystore.SetFailedClass(ctx, tx, ch.row.Kind, ch.row.ItemID, ch.row.LastErrorClass)
	}
	return nil
}

// overtookFailure reports a fact the scheduler made on its own (an
// operator's cancel or manual retry) arriving while the row awaits the
// decision of a failure. Every failure the scheduler applies yields a
// decision published before anything it does later to the item, so the
// live scheduler applied this fact first and found the failure stale: the
// failure reached the stream first only because the owner published it
// while the operator's event was still in the outbox.
func overtookFailure(f fact) bool {
	if f.ev.Envelope.Source != source {
		return false
	}
	switch f.ev.Event {
	case contract.Cancelled:
		return true
	case contract.Scheduled, contract.Rescheduled:
		return f.ev.Scheduled.Decision.DecidedBy == contract.DecidedByManual
	}
	return false
}

// undoFailure puts the row back as it was before the failure and drops
// the failure's history entry.
func (rb *rebuilder) undoFailure(ctx context.Context, tx pgx.Tx, key retrystore.Key, u undoFailure) (*retrystore.Retry, error) {
	delete(rb.undo, key)
	rb.stats.Applied--
	rb.stats.Stale++
	if err := retrystore.DeleteHistory(ctx, tx, key.Kind, key.ItemID, u.msgID); err != nil {
		return nil, err
	}
	if u.prev == nil {
		return nil, retrystore.Delete(ctx, tx, key.Kind, key.ItemID)
	}
	saved, err := retrystore.Save(ctx, tx, *u.prev)
	return &saved, err
}

// decideAwaiting makes the decisions the stream does not hold: failures
// the scheduler consumed but whose events were lost with the database.
func (rb *rebuilder) decideAwaiting(ctx context.Context) error {
	keys, err := retrystore.Undecided(ctx, rb.conn)
	if err != nil {
		return err
	}
	for _, k := range keys {
		if err := rb.decideOne(ctx, k); err != nil {
			return fmt.Errorf("rebuild: decide %s/%s: %w", k.Kind, k.ItemID, err)
		}
		rb.stats.Decided++
	}
	return nil
}

func (rb *rebuilder) decideOne(ctx context.Context, k retrystore.Key) error {
	tx, err := rb.conn.Begin(ctx)
	if err != nil {
		return err
	}
	defer tx.Rollback(context.WithoutCancel(ctx)) //nolint:errcheck // no-op after commit
	now, err := retrystore.DBNow(ctx, tx)
	if err != nil {
		return err
	}
	row, err := lockRow(ctx, tx, k.Kind, k.ItemID)
	if err != nil || !awaitingDecision(row) {
		return err
	}
	hist, err := retrystore.History(ctx, tx, k.Kind, k.ItemID)
	if err != nil {
		return err
	}
	f := failure{class: errclass.Class(row.LastErrorClass), message: row.LastErrorMessage}
	for i := len(hist) - 1; i >= 0; i-- {
		if hist[i].Event == string(contract.Held) && hist[i].Attempt == row.Attempt {
			var d heldDetailJSON
			_ = json.Unmarshal(hist[i].Detail, &d)
			hd := &contract.HeldData{Reason: d.Reason, Until: d.Until, HoldKey: d.HoldKey}
			if f.hold, err = holdOf(ctx, tx, row, hd, hist[i].At); err != nil {
				return err
			}
			f.message = d.Detail
			break
		}
		if hist[i].Event == string(contract.Failed) && hist[i].Attempt == row.Attempt {
			var d failedDetailJSON
			if len(hist[i].Detail) > 0 && json.Unmarshal(hist[i].Detail, &d) == nil {
				f.retryAfter = d.RetryAfter
				f.nonRetryable = d.NonRetryable
			}
			break
		}
	}
	d := &decider{policies: policyCache{}}
	ch, err := d.decide(ctx, tx, *row, f, nil, now)
	if err != nil {
		return err
	}
	if err := write(ctx, tx, ch); err != nil {
		return err
	}
	return tx.Commit(ctx)
}
