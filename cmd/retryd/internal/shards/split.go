package shards

import (
	"context"
	"errors"
	"fmt"
	"slices"
	"strings"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/nats-io/nats.go/jetstream"
	"github.com/rs/zerolog"

	"github.com/retryd/retryd/internal/streams"
	"github.com/retryd/retryd/pkg/contract"
	"github.com/retryd/retryd/services/scheduler"
)

// ErrLayout: the counts or databases given do not fit the stream.
var ErrLayout = errors.New("shard layout")

// SplitOptions are a split's inputs.
type SplitOptions struct {
	// From is the count before the split; 0 takes the stream's. A rerun
	// after the stream was split names it (the stream then says To).
	From int
	To   int
	// URLs are the databases of shards 0 to To-1, in order.
	URLs []string
	// Streams are the options streams.Ensure splits RETRIES with (their
	// Shards is set to To).
	Streams streams.Options
	Batch   int
	DryRun  bool
	// Poll is how often the wait for the old shards reads their
	// consumers (default 1s).
	Poll time.Duration
	Log  zerolog.Logger
	Hook Hook
}

// SplitReport is what a split did.
type SplitReport struct {
	From int `json:"from"`
	To   int `json:"to"`
	// Split: this run changed the stream (false on a rerun).
	Split bool `json:"split"`
	// Sequence is the stream's last sequence the old shards applied.
	Sequence uint64  `json:"sequence"`
	Moved    []Moved `json:"moved"`
	DryRun   bool    `json:"dry_run"`
}

// Layout checks From and To against the stream's count have and returns
// From: To must be a multiple of From above it, and the stream split
// into From (a first run) or To (a rerun).
func Layout(have, from, to, urls int) (int, error) {
	if from == 0 && have == to {
		return 0, fmt.Errorf("%w: stream %s is already split into %d shards: to finish a split into %d, give --from, the count before it", ErrLayout, contract.StreamRetries, have, to)
	}
	if from == 0 {
		from = have
	}
	switch {
	case from < 1 || from > contract.MaxShards:
		return 0, fmt.Errorf("%w: --from must be between 1 and %d, got %d", ErrLayout, contract.MaxShards, from)
	case to <= from || to%from != 0 || to > contract.MaxShards:
		return 0, fmt.Errorf("%w: --to must be a multiple of %d above it, at most %d, got %d (a split only multiplies the count; see docs/shards.md)",
			ErrLayout, from, contract.MaxShards, to)
	case have != from && have != to:
		return 0, fmt.Errorf("%w: stream %s is split into %d shards, neither --from %d nor --to %d", ErrLayout, contract.StreamRetries, have, from, to)
	case urls != to:
		return 0, fmt.Errorf("%w: --database-url: want %d, one per shard of the new count in order (shards 0 to %d), got %d",
			ErrLayout, to, to-1, urls)
	}
	return from, nil
}

// retriesShards reads the RETRIES stream and how many shards its subject
// transform splits it into; a transform retryd did not write is
// ErrLayout, since no count read from it can be trusted.
func retriesShards(ctx context.Context, js jetstream.JetStream) (*jetstream.StreamInfo, int, error) {
	stream, err := js.Stream(ctx, contract.StreamRetries)
	if err != nil {
		return nil, 0, fmt.Errorf("read stream %s: %w", contract.StreamRetries, err)
	}
	info := stream.CachedInfo()
	n, ok := streams.StreamShards(info.Config)
	if !ok {
		return nil, 0, fmt.Errorf("%w: stream %s has a subject transform retryd did not write", ErrLayout, contract.StreamRetries)
	}
	return info, n, nil
}

// Split reshards From shards into To: it splits the stream, waits until
// every old shard applied what the old layout stored, then moves each
// item whose shard changed to its new shard's database. Every step is
// safe to run again; a rerun with the same flags finishes a split that
// stopped anywhere. The new shards' schedulers must not run until it
// returns.
func Split(ctx context.Context, js jetstream.JetStream, o SplitOptions) (SplitReport, error) {
	rep := SplitReport{To: o.To, DryRun: o.DryRun}
	info, have, err := retriesShards(ctx, js)
	if err != nil {
		return rep, err
	}
	if rep.From, err = Layout(have, o.From, o.To, len(o.URLs)); err != nil {
		return rep, err
	}
	conns, err := connect(ctx, o.URLs)
	defer func() {
		for _, c := range conns {
			c.Close(context.WithoutCancel(ctx))
		}
	}()
	if err != nil {
		return rep, err
	}
	if err := sameSchema(ctx, conns); err != nil {
		return rep, err
	}
	running, err := runningShards(ctx, js, rep.From, o.To)
	if err != nil {
		return rep, err
	}
	rep.Sequence = info.State.LastSeq
	if have == rep.From && !o.DryRun {
		if rep.Sequence, err = splitStream(ctx, js, rep.From, o); err != nil {
			return rep, err
		}
		rep.Split = true
		o.Log.Info().Int("from", rep.From).Int("to", o.To).Uint64("sequence", rep.Sequence).Msg("stream split; waiting for the old shards to apply what the old layout stored")
	}
	if !o.DryRun {
		if err := waitApplied(ctx, js, rep.From, rep.Sequence, o); err != nil {
			return rep, err
		}
	}
	for s := range rep.From {
		targets := map[int]*pgx.Conn{}
		for t := s + rep.From; t < o.To; t += rep.From {
			targets[t] = conns[t]
		}
		if !o.DryRun {
			if err := copyPolicies(ctx, conns[s], targets); err != nil {
				return rep, err
			}
			if err := copyReleases(ctx, conns[s], targets); err != nil {
				return rep, err
			}
		}
		moved, err := Move{From: s, Source: conns[s], Targets: targets, Shards: o.To, Batch: o.Batch, DryRun: o.DryRun, Log: o.Log, Hook: o.Hook, Running: running}.Run(ctx)
		if err != nil {
			return rep, fmt.Errorf("move shard %d's items: %w", s, err)
		}
		rep.Moved = append(rep.Moved, moved...)
	}
	return rep, nil
}

func connect(ctx context.Context, urls []string) ([]*pgx.Conn, error) {
	var out []*pgx.Conn
	for i, u := range urls {
		c, err := pgx.Connect(ctx, u)
		if err != nil {
			return out, fmt.Errorf("connect to shard %d's database (--database-url #%d): %w", i, i+1, err)
		}
		out = append(out, c)
	}
	return out, nil
}

// sameSchema refuses databases whose tables differ (a shard not
// migrated, or the same database given twice): rows move column by column.
func sameSchema(ctx context.Context, conns []*pgx.Conn) error {
	var first []string
	seen := map[string]int{}
	for i, c := range conns {
		var id string
		if err := c.QueryRow(ctx, `SELECT current_database() || '@' || coalesce(inet_server_addr()::text, 'local') || ':' || current_setting('port')`).Scan(&id); err != nil {
			return fmt.Errorf("identify shard %d's database: %w", i, err)
		}
		if j, dup := seen[id]; dup {
			return fmt.Errorf("%w: --database-url: shards %d and %d name the same database %s; each shard needs its own", ErrLayout, j, i, id)
		}
		seen[id] = i
		var cols []string
		for _, table := range []string{"retries", "retry_history", "inbox"} {
			c, err := columns(ctx, c, table)
			if err != nil {
				return fmt.Errorf("shard %d: %w (run retryd migrate on it)", i, err)
			}
			cols = append(cols, c...)
		}
		if i == 0 {
			first = cols
		} else if !slices.Equal(first, cols) {
			return fmt.Errorf("%w: --database-url: shard %d's schema differs from shard 0's: run retryd migrate on every shard database", ErrLayout, i)
		}
	}
	return nil
}

// runningShards are the new shards whose scheduler has consumed: no row
// may move into them (it would decide on items while their rows arrive).
// A consumer that exists but took nothing (created by a scheduler started
// too early and stopped) is no harm. After a finished split they all run,
// and a rerun has nothing to move.
func runningShards(ctx context.Context, js jetstream.JetStream, from, to int) (map[int]uint64, error) {
	out := map[int]uint64{}
	for k := from; k < to; k++ {
		c, err := js.Consumer(ctx, contract.StreamRetries, scheduler.ConsumerNameOf(k))
		if errors.Is(err, jetstream.ErrConsumerNotFound) {
			continue
		}
		if err != nil {
			return nil, fmt.Errorf("read consumer %s: %w", scheduler.ConsumerNameOf(k), err)
		}
		if info := c.CachedInfo(); info.Delivered.Stream > 0 {
			out[k] = info.Delivered.Stream
		}
	}
	return out, nil
}

// splitStream points the old shards' consumers at their facts under the
// new layout, then splits the stream, and returns its last sequence then.
// Only the unsplit shard 0's filters change (a shard of a split stream
// keeps its token): its scheduler reads four-token subjects, and the
// facts of its items stored with token 0 after the split would otherwise
// pass it by, the consumer's position moving over them.
func splitStream(ctx context.Context, js jetstream.JetStream, from int, o SplitOptions) (uint64, error) {
	for s := range from {
		c, err := js.Consumer(ctx, contract.StreamRetries, scheduler.ConsumerNameOf(s))
		if err != nil {
			return 0, fmt.Errorf("read shard %d's consumer %s (start its scheduler first): %w", s, scheduler.ConsumerNameOf(s), err)
		}
		cfg := c.CachedInfo().Config
		want := scheduler.ConsumerConfig(scheduler.Config{Shards: o.To, Shard: s})
		if slices.Equal(cfg.FilterSubjects, want.FilterSubjects) {
			continue
		}
		cfg.FilterSubjects, cfg.FilterSubject, cfg.Description = want.FilterSubjects, "", want.Description
		if _, err := js.UpdateConsumer(ctx, contract.StreamRetries, cfg); err != nil {
			return 0, fmt.Errorf("update shard %d's consumer %s: %w", s, cfg.Durable, err)
		}
	}
	opts := o.Streams
	opts.Shards = o.To
	if err := streams.Ensure(ctx, js, opts); err != nil {
		return 0, fmt.Errorf("split stream: %w", err)
	}
	info, n, err := retriesShards(ctx, js)
	if err != nil {
		return 0, err
	}
	if n != o.To {
		return 0, fmt.Errorf("stream %s is split into %d shards after ensure, want %d", contract.StreamRetries, n, o.To)
	}
	return info.State.LastSeq, nil
}

// waitApplied waits until each old shard's consumer has acknowledged
// every fact it takes up to seq: no fact the old layout stored about an
// item that moves is still to be applied on its old shard.
func waitApplied(ctx context.Context, js jetstream.JetStream, from int, seq uint64, o SplitOptions) error {
	poll := o.Poll
	if poll <= 0 {
		poll = time.Second
	}
	for s := range from {
		name := scheduler.ConsumerNameOf(s)
		last := time.Time{}
		for {
			c, err := js.Consumer(ctx, contract.StreamRetries, name)
			if err != nil {
				return fmt.Errorf("read shard %d's consumer %s: %w", s, name, err)
			}
			info, err := c.Info(ctx)
			if err != nil {
				return fmt.Errorf("read shard %d's consumer %s: %w", s, name, err)
			}
			if applied(info, seq) {
				o.Log.Info().Int("shard", s).Str("consumer", name).Uint64("ack_floor", info.AckFloor.Stream).Msg("old shard applied the old layout")
				break
			}
			if time.Since(last) >= 5*time.Second {
				last = time.Now()
				o.Log.Info().Int("shard", s).Str("consumer", name).Uint64("ack_floor", info.AckFloor.Stream).Uint64("want", seq).
					Int("ack_pending", info.NumAckPending).Uint64("pending", info.NumPending).Msg("waiting for the old shard's scheduler to apply its facts (is it running?)")
			}
			select {
			case <-ctx.Done():
				return fmt.Errorf("wait for shard %d's consumer %s to reach %d (ack floor %d): %w", s, name, seq, info.AckFloor.Stream, ctx.Err())
			case <-time.After(poll):
			}
		}
	}
	return nil
}

// applied: every message the consumer takes up to seq is acknowledged.
// The ack floor stays at the last fact acknowledged while only messages
// the consumer does not take follow (dues, decisions), so a consumer with
// nothing in flight that delivered past seq, or has nothing left to
// deliver, is through too.
func applied(info *jetstream.ConsumerInfo, seq uint64) bool {
	if info.AckFloor.Stream >= seq {
		return true
	}
	return info.NumAckPending == 0 && (info.Delivered.Stream >= seq || info.NumPending == 0)
}

// copyPolicies gives each new shard its parent's retry policies: a
// policy changed through the API lives in the shard database it was
// written to, and the moved items keep deciding by it. A target's policy
// of a higher version is kept.
func copyPolicies(ctx context.Context, src *pgx.Conn, targets map[int]*pgx.Conn) error {
	var policies, versions string
	if err := src.QueryRow(ctx, `SELECT coalesce(json_agg(row_to_json(p)), '[]') FROM retry_policies p`).Scan(&policies); err != nil {
		return fmt.Errorf("read retry_policies: %w", err)
	}
	if err := src.QueryRow(ctx, `SELECT coalesce(json_agg(row_to_json(v)), '[]') FROM retry_policy_versions v`).Scan(&versions); err != nil {
		return fmt.Errorf("read retry_policy_versions: %w", err)
	}
	for _, t := range sortedKeys(targets) {
		c := targets[t]
		cols, err := columns(ctx, c, "retry_policies")
		if err != nil {
			return err
		}
		set := make([]string, 0, len(cols))
		for _, col := range cols {
			set = append(set, col+" = EXCLUDED."+col)
		}
		_, err = c.Exec(ctx, `INSERT INTO retry_policies SELECT * FROM json_populate_recordset(NULL::retry_policies, $1::json)
ON CONFLICT (kind, job_type) DO UPDATE SET `+strings.Join(set, ", ")+` WHERE retry_policies.version < EXCLUDED.version`, policies)
		if err != nil {
			return fmt.Errorf("write retry_policies of shard %d: %w", t, err)
		}
		if _, err := c.Exec(ctx, `INSERT INTO retry_policy_versions SELECT * FROM json_populate_recordset(NULL::retry_policy_versions, $1::json)
ON CONFLICT DO NOTHING`, versions); err != nil {
			return fmt.Errorf("write retry_policy_versions of shard %d: %w", t, err)
		}
	}
	return nil
}
