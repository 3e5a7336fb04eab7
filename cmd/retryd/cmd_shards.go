package main

import (
	"context"
	"errors"
	"fmt"
	"sort"
	"strconv"
	"time"

	"github.com/jackc/pgx/v5/pgxpool"
	"github.com/nats-io/nats.go/jetstream"
	"github.com/spf13/cobra"

	"github.com/retryd/retryd/internal/envvar"
	"github.com/retryd/retryd/internal/streams"
	"github.com/retryd/retryd/pkg/contract"
	"github.com/retryd/retryd/projections/reshard"
	"github.com/retryd/retryd/services/scheduler"
)

func newShardsCmd(g *globals) *cobra.Command {
	cmd := group(&cobra.Command{
		Use:   "shards",
		Short: "Scheduler shards: where RETRIES and the shards' databases stand, and resharding (docs/shards.md)",
	})
	cmd.AddCommand(newShardsStatusCmd(g), newShardsSplitCmd(g))
	return cmd
}

// shardDBs opens one pool per --database-url, in shard order, and checks
// each answers and is migrated.
func shardDBs(ctx context.Context, cmd *cobra.Command, urls []string) ([]*pgxpool.Pool, func(), error) {
	var pools []*pgxpool.Pool
	closeAll := func() {
		for _, p := range pools {
			p.Close()
		}
	}
	for k, url := range urls {
		p, err := pgxpool.New(ctx, url)
		if err != nil {
			closeAll()
			return nil, nil, usageErrorf(cmd, "--database-url (shard %d): %v", k, err)
		}
		pools = append(pools, p)
		var migrated bool
		if err := p.QueryRow(ctx, `SELECT to_regclass('retries') IS NOT NULL`).Scan(&migrated); err != nil {
			closeAll()
			return nil, nil, fmt.Errorf("connect to shard %d's database: %w", k, err)
		}
		if !migrated {
			closeAll()
			return nil, nil, fmt.Errorf("shard %d's database has no retries table: run retryd migrate on it first", k)
		}
	}
	return pools, closeAll, nil
}

// streamShards is how many shards RETRIES is split into, and its last
// sequence.
func streamShards(ctx context.Context, js jetstream.JetStream) (int, uint64, error) {
	s, err := js.Stream(ctx, contract.StreamRetries)
	if err != nil {
		return 0, 0, fmt.Errorf("read stream %s: %w", contract.StreamRetries, err)
	}
	info := s.CachedInfo()
	n, ok := streams.StreamShards(info.Config)
	if !ok {
		return 0, 0, fmt.Errorf("stream %s has a subject transform retryd did not write", contract.StreamRetries)
	}
	return n, info.State.LastSeq, nil
}

// shardConsumer is one shard's durable consumer as the server reports it.
type shardConsumer struct {
	Shard      int    `json:"shard"`
	Name       string `json:"name"`
	Exists     bool   `json:"exists"`
	Pending    uint64 `json:"pending"`
	AckPending int    `json:"ack_pending"`
	AckFloor   uint64 `json:"ack_floor"`
}

// appliedThrough reports whether the consumer has applied every fact the
// stream stored up to seq that its filter takes.
func (c shardConsumer) appliedThrough(seq uint64) bool {
	return !c.Exists || c.AckFloor >= seq || (c.Pending == 0 && c.AckPending == 0)
}

func readConsumer(ctx context.Context, js jetstream.JetStream, shard int) (shardConsumer, error) {
	c := shardConsumer{Shard: shard, Name: scheduler.ConsumerNameOf(shard)}
	cons, err := js.Consumer(ctx, contract.StreamRetries, c.Name)
	if errors.Is(err, jetstream.ErrConsumerNotFound) {
		return c, nil
	}
	if err != nil {
		return c, fmt.Errorf("read consumer %s: %w", c.Name, err)
	}
	info := cons.CachedInfo()
	c.Exists, c.Pending, c.AckPending, c.AckFloor = true, info.NumPending, info.NumAckPending, info.AckFloor.Stream
	return c, nil
}

type shardsStatus struct {
	StreamShards int             `json:"stream_shards"`
	LastSeq      uint64          `json:"last_seq"`
	Consumers    []shardConsumer `json:"consumers"`
	// Rows and Misplaced per database (--database-url order): the
	// retries it holds and those whose shard under the stream's count is
	// another (a split whose move is not done).
	Rows      []int64 `json:"rows,omitempty"`
	Misplaced []int64 `json:"misplaced,omitempty"`
}

func newShardsStatusCmd(g *globals) *cobra.Command {
	var nf natsFlags
	var urls []string
	cmd := &cobra.Command{
		Use:   "status",
		Short: "How RETRIES is split, each shard's consumer and, given the databases, each shard's rows",
		Example: `  retryd shards status
  retryd shards status --database-url postgres://…/retryd --database-url postgres://…/retryd_shard1`,
		Args: args(0),
		RunE: func(cmd *cobra.Command, _ []string) error {
			return nf.run(cmd, g, func(ctx context.Context, js jetstream.JetStream) error {
				var st shardsStatus
				var err error
				if st.StreamShards, st.LastSeq, err = streamShards(ctx, js); err != nil {
					return err
				}
				for k := range max(st.StreamShards, len(urls)) {
					c, err := readConsumer(ctx, js, k)
					if err != nil {
						return err
					}
					st.Consumers = append(st.Consumers, c)
				}
				if len(urls) > 0 {
					pools, closeAll, err := shardDBs(ctx, cmd, urls)
					if err != nil {
						return err
					}
					defer closeAll()
					if st.Rows, st.Misplaced, err = misplaced(ctx, pools, st.StreamShards); err != nil {
						return err
					}
				}
				return printShardsStatus(g, st)
			})
		},
	}
	nf.register(cmd)
	cmd.Flags().StringArrayVar(&urls, "database-url", nil, "a shard's database, once per shard in shard order (as the owner or the readonly role)")
	return cmd
}

// misplaced counts each database's rows, and those another shard owns
// under shards (a dry run of the move).
func misplaced(ctx context.Context, pools []*pgxpool.Pool, shards int) (rows, wrong []int64, err error) {
	for k, p := range pools {
		var n int64
		if err := p.QueryRow(ctx, `SELECT count(*) FROM retries`).Scan(&n); err != nil {
			return nil, nil, fmt.Errorf("count shard %d's rows: %w", k, err)
		}
		rows = append(rows, n)
	}
	wrong = make([]int64, len(pools))
	if len(pools) != shards {
		return rows, nil, nil
	}
	st, err := reshard.Move(ctx, pools, reshard.Options{Shards: shards, DryRun: true})
	if err != nil {
		return nil, nil, err
	}
	for pair, n := range st.Moved {
		var from, to int
		if _, err := fmt.Sscanf(pair, "%d->%d", &from, &to); err == nil {
			wrong[from] += n
		}
	}
	return rows, wrong, nil
}

func printShardsStatus(g *globals, st shardsStatus) error {
	if g.json {
		return writeJSON(g.stdout, st)
	}
	fmt.Fprintf(g.stdout, "RETRIES is split into %d shard(s); last sequence %d.\n", st.StreamShards, st.LastSeq)
	t := newTable(g.stdout, "SHARD", "CONSUMER", "PENDING", "ACK PENDING", "ACK FLOOR", "ROWS", "ON ANOTHER SHARD")
	for i, c := range st.Consumers {
		rows, wrong := "", ""
		if i < len(st.Rows) {
			rows = strconv.FormatInt(st.Rows[i], 10)
			if st.Misplaced != nil {
				wrong = strconv.FormatInt(st.Misplaced[i], 10)
			}
		}
		if !c.Exists {
			t.row(strconv.Itoa(c.Shard), c.Name+" (none)", "", "", "", rows, wrong)
			continue
		}
		t.row(strconv.Itoa(c.Shard), c.Name, strconv.FormatUint(c.Pending, 10), strconv.Itoa(c.AckPending),
			strconv.FormatUint(c.AckFloor, 10), rows, wrong)
	}
	return t.flush()
}

// splitResult is what `shards split` did.
type splitResult struct {
	From     int              `json:"from"`
	To       int              `json:"to"`
	Cut      uint64           `json:"cut"`
	DryRun   bool             `json:"dry_run,omitempty"`
	Moved    map[string]int64 `json:"moved"`
	Rows     int64            `json:"rows"`
	Releases int64            `json:"releases"`
}

func newShardsSplitCmd(g *globals) *cobra.Command {
	var nf natsFlags
	var urls []string
	var to, from, batch int
	var waitFor time.Duration
	var dry bool
	cmd := &cobra.Command{
		Use:   "split",
		Short: "Reshard: split RETRIES into --to shards and move each item's rows to its new shard's database",
		Long: `split reshards a running deployment from N scheduler shards to --to, a
multiple of N (docs/shards.md, Resharding). In order:

 1. RETRIES is split into --to shards (the RETRYD_STREAM_* limits apply,
    as with retryd streams ensure). Facts stored from then on carry the
    new shard token; an item that changes shard goes from shard s to
    s+N, s+2N, ...
 2. It waits until every old shard's scheduler has applied every fact
    stored on the old layout (its consumer's ack floor passes the split's
    sequence), so no old fact about a moving item is still to come.
 3. It moves the rows of every item whose shard changes, with their
    history, from the old shard's database to the new one, in batches;
    the old shards' schedulers may keep running.

Give --database-url once per shard of the new layout, in shard order, as
the owner; the new databases must be migrated (retryd migrate). Do not
start the new shards' schedulers before split returns. Interrupted, run
it again with the same flags and --from N: it resumes.`,
		Example: `  retryd shards split --to 2 --database-url postgres://…/retryd --database-url postgres://…/retryd_shard1
  retryd shards split --to 4 --database-url … (4 times) --dry-run`,
		Args: args(0),
		RunE: func(cmd *cobra.Command, _ []string) error {
			if to < 2 || to > contract.MaxShards {
				return usageErrorf(cmd, "--to: want a shard count between 2 and %d, got %d", contract.MaxShards, to)
			}
			if len(urls) != to {
				return usageErrorf(cmd, "--database-url is given %d times for --to %d: give every shard's database, in shard order", len(urls), to)
			}
			var e envvar.Reader
			opts := streams.OptionsFromEnv(&e)
			if err := e.Err(); err != nil {
				return err
			}
			nc, js, err := nf.connect(cmd.Context(), g)
			if err != nil {
				return err
			}
			defer nc.Close()
			ctx := cmd.Context()
			have, last, err := streamShards(ctx, js)
			if err != nil {
				return err
			}
			old := have
			switch {
			case have == to && from == 0:
				return usageErrorf(cmd, "RETRIES is already split into %d shards: to resume a split, give --from, the count before it", to)
			case have == to:
				old = from
			case from != 0 && from != have:
				return usageErrorf(cmd, "--from %d: RETRIES is split into %d shards", from, have)
			case have > to || to%have != 0:
				return usageErrorf(cmd, "--to %d: RETRIES is split into %d shards; a split only multiplies the count (2, 3 ... times %d)", to, have, have)
			}
			if old < 1 || to%old != 0 || old >= to {
				return usageErrorf(cmd, "--from %d: want the count before the split, a divisor of %d below it", old, to)
			}
			pools, closeAll, err := shardDBs(ctx, cmd, urls)
			if err != nil {
				return err
			}
			defer closeAll()
			log := g.progressLog()
			res := splitResult{From: old, To: to, Cut: last, DryRun: dry}
			if !dry && have < to {
				opts.Shards = to
				if err := streams.Ensure(ctx, js, opts); err != nil {
					return err
				}
				if _, res.Cut, err = streamShards(ctx, js); err != nil {
					return err
				}
				log.Info().Int("from", old).Int("to", to).Uint64("cut", res.Cut).Msg("RETRIES split; facts from here on carry the new shard token")
			}
			if !dry {
				if err := waitApplied(ctx, js, old, res.Cut, waitFor, g); err != nil {
					return err
				}
			}
			st, err := reshard.Move(ctx, pools, reshard.Options{Shards: to, Batch: batch, DryRun: dry, Progress: func(p reshard.Progress) {
				log.Info().Int("from_shard", p.From).Int64("moved", p.Moved).Int64("total", p.Total).Msg("rows moved")
			}})
			res.Moved, res.Rows, res.Releases = st.Moved, st.Rows, st.Releases
			if err != nil {
				return fmt.Errorf("%w (run the same command with --from %d to resume)", err, old)
			}
			return printSplit(g, res)
		},
	}
	nf.register(cmd)
	cmd.Flags().IntVar(&to, "to", 0, "the new shard count, a multiple of the current one")
	cmd.Flags().IntVar(&from, "from", 0, "resume: the shard count before the split (when RETRIES already has --to)")
	cmd.Flags().StringArrayVar(&urls, "database-url", nil, "each shard's database in the new layout, in shard order, as the owner (once per shard)")
	cmd.Flags().IntVar(&batch, "batch", reshard.DefaultBatch, "rows moved per pair of transactions")
	cmd.Flags().DurationVar(&waitFor, "wait", 10*time.Minute, "longest wait for the old shards to apply the facts stored before the split")
	cmd.Flags().BoolVar(&dry, "dry-run", false, "change nothing: count the rows that would move")
	return cmd
}

// waitApplied waits until the consumer of each old shard has applied the
// stream up to cut, reporting what is left every few seconds.
func waitApplied(ctx context.Context, js jetstream.JetStream, old int, cut uint64, bound time.Duration, g *globals) error {
	log := g.progressLog()
	deadline := time.Now().Add(bound)
	lastReport := time.Time{}
	for {
		var left []shardConsumer
		for k := range old {
			c, err := readConsumer(ctx, js, k)
			if err != nil {
				return err
			}
			if !c.appliedThrough(cut) {
				left = append(left, c)
			}
		}
		if len(left) == 0 {
			log.Info().Int("shards", old).Uint64("cut", cut).Msg("every old shard applied the facts stored before the split")
			return nil
		}
		if time.Since(lastReport) > 3*time.Second {
			for _, c := range left {
				log.Info().Int("shard", c.Shard).Uint64("ack_floor", c.AckFloor).Uint64("cut", cut).Uint64("pending", c.Pending).
					Msg("waiting for the shard's scheduler to apply the facts stored before the split")
			}
			lastReport = time.Now()
		}
		if time.Now().After(deadline) {
			return fmt.Errorf("shard %d's scheduler has not applied the stream up to %d after %s (ack floor %d): is it running? Nothing was moved; run again with --from %d",
				left[0].Shard, cut, bound, left[0].AckFloor, old)
		}
		t := time.NewTimer(200 * time.Millisecond)
		select {
		case <-ctx.Done():
			t.Stop()
			return ctx.Err()
		case <-t.C:
		}
	}
}

func printSplit(g *globals, res splitResult) error {
	if g.json {
		return writeJSON(g.stdout, res)
	}
	verb := "moved"
	if res.DryRun {
		verb = "would move"
	}
	pairs := make([]string, 0, len(res.Moved))
	for p := range res.Moved {
		pairs = append(pairs, p)
	}
	sort.Strings(pairs)
	fmt.Fprintf(g.stdout, "split %d -> %d shards: %s %d rows\n", res.From, res.To, verb, res.Rows)
	for _, p := range pairs {
		fmt.Fprintf(g.stdout, "  shard %s: %d\n", p, res.Moved[p])
	}
	if res.DryRun {
		fmt.Fprintln(g.stdout, "Dry run: RETRIES and the databases are unchanged.")
		return nil
	}
	fmt.Fprintf(g.stdout, "Now start the schedulers of shards %d to %d (RETRYD_SHARDS=%d, RETRYD_SHARD=k, each on its database), and restart the others with RETRYD_SHARDS=%d.\n",
		res.From, res.To-1, res.To, res.To)
	return nil
}
