package main

import (
	"context"
	"errors"
	"fmt"
	"strconv"

	"github.com/nats-io/nats.go/jetstream"
	"github.com/spf13/cobra"

	"github.com/retryd/retryd/cmd/retryd/internal/shards"
	"github.com/retryd/retryd/internal/envvar"
	"github.com/retryd/retryd/internal/streams"
)

func newShardsCmd(g *globals) *cobra.Command {
	cmd := group(&cobra.Command{
		Use:   "shards",
		Short: "Scheduler shards: show them, split them into more (docs/shards.md)",
		Long: `RETRIES can be split into scheduler shards, each a retryd-scheduler with its
own database (docs/shards.md). status shows each shard; split multiplies
their number and moves the items whose shard changes. Both connect to NATS
with the NATS_* environment variables or --nats-url, and to each shard's
database with --database-url, once per shard, in shard order.`,
	})
	cmd.AddCommand(newShardsStatusCmd(g), newShardsSplitCmd(g))
	return cmd
}

func newShardsStatusCmd(g *globals) *cobra.Command {
	var nf natsFlags
	var urls []string
	cmd := &cobra.Command{
		Use:     "status",
		Short:   "Show the stream's shard count and each shard's consumer and rows",
		Example: `  retryd shards status --database-url postgres://db0/retryd --database-url postgres://db1/retryd`,
		Args:    args(0),
		RunE: func(cmd *cobra.Command, _ []string) error {
			return nf.run(cmd, g, func(ctx context.Context, js jetstream.JetStream) error {
				st, err := shards.ReadStatus(ctx, js, urls)
				if errors.Is(err, shards.ErrLayout) {
					return usageErrorf(cmd, "%v", err)
				}
				if err != nil {
					return err
				}
				if g.json {
					return writeJSON(g.stdout, st)
				}
				return writeShardStatus(g, st)
			})
		},
	}
	nf.register(cmd)
	cmd.Flags().StringArrayVar(&urls, "database-url", nil, "a shard's Postgres URL, once per shard in order from shard 0 (optional: rows are counted for those given)")
	return cmd
}

func writeShardStatus(g *globals, st shards.Status) error {
	fmt.Fprintf(g.stdout, "RETRIES is split into %d shard(s); last sequence %d.\n", st.Shards, st.LastSeq)
	t := newTable(g.stdout, "SHARD", "CONSUMER", "PENDING", "ACK PENDING", "ACK FLOOR", "PENDING ROWS", "ROWS", "OTHER SHARD'S ROWS")
	elsewhere := int64(0)
	for _, s := range st.PerShard {
		pending, ack, floor := "missing", "", ""
		if s.Exists {
			pending, ack, floor = strconv.FormatUint(s.Pending, 10), strconv.Itoa(s.AckPending), strconv.FormatUint(s.AckFloor, 10)
		}
		rp, rt, re := "", "", ""
		if s.Rows != nil {
			rp, rt, re = strconv.FormatInt(s.Rows.Pending, 10), strconv.FormatInt(s.Rows.Total, 10), strconv.FormatInt(s.Rows.Elsewhere, 10)
			elsewhere += s.Rows.Elsewhere
		}
		t.row(strconv.Itoa(s.Shard), s.Consumer, pending, ack, floor, rp, rt, re)
	}
	if err := t.flush(); err != nil {
		return err
	}
	if elsewhere > 0 {
		fmt.Fprintf(g.stdout, "%d row(s) belong to another shard: a split has not finished moving them; run retryd shards split again.\n", elsewhere)
	}
	return nil
}

func newShardsSplitCmd(g *globals) *cobra.Command {
	var nf natsFlags
	var urls []string
	var from, to, batch int
	var dry bool
	cmd := &cobra.Command{
		Use:   "split",
		Short: "Multiply the scheduler shards and move the items whose shard changes; safe to run again",
		Long: `split reshards N scheduler shards into a multiple of N (docs/shards.md):

  1. it splits RETRIES into --to shards (as retryd streams ensure with
     RETRYD_SHARDS=--to) and records the stream's last sequence;
  2. it waits until every old shard's scheduler has applied every fact
     stored up to that sequence (its consumer's ack floor);
  3. it moves each item whose shard changes (shard s goes to s, s+N,
     s+2N...) from the old shard's database to the new shard's, in
     batches: its retries row, its history and the inbox records of its
     facts, and the new shards get the old ones' retry policies.

The old shards' schedulers keep running throughout; a row being moved is
locked, so no due is emitted for it meanwhile. Do NOT start the new
shards' schedulers before split has finished: split refuses to move into
a shard whose consumer took anything. Then start them (RETRYD_SHARDS=--to,
RETRYD_SHARD=k) and restart the old ones with RETRYD_SHARDS=--to.

A split that stopped anywhere (crash, Ctrl-C) is finished by running it
again with the same flags; once the stream is split, give --from too.`,
		Example: `  retryd shards split --to 2 --database-url postgres://db0/retryd --database-url postgres://db1/retryd
  retryd shards split --from 2 --to 4 --dry-run --database-url ... (4 times)`,
		Args: args(0),
		RunE: func(cmd *cobra.Command, _ []string) error {
			if to < 2 {
				return usageErrorf(cmd, "--to is required: the new shard count, a multiple of the current one")
			}
			if batch < 1 {
				return usageErrorf(cmd, "--batch: want a positive number of items, got %d", batch)
			}
			var e envvar.Reader
			opts := streams.OptionsFromEnv(&e)
			if err := e.Err(); err != nil {
				return err
			}
			log := g.progressLog()
			return nf.run(cmd, g, func(_ context.Context, js jetstream.JetStream) error {
				// The wait for the old shards has no bound but Ctrl-C:
				// --timeout bounds each request only.
				rep, err := shards.Split(cmd.Context(), js, shards.SplitOptions{
					From: from, To: to, URLs: urls, Streams: opts, Batch: batch, DryRun: dry, Log: log,
				})
				if errors.Is(err, shards.ErrLayout) {
					return usageErrorf(cmd, "%v", err)
				}
				if errors.Is(err, shards.ErrShardRunning) {
					return fmt.Errorf("split: %w", err)
				}
				if err != nil {
					return fmt.Errorf("split: %w (run the same command again to finish)", err)
				}
				if g.json {
					return writeJSON(g.stdout, rep)
				}
				return writeSplit(g, rep)
			})
		},
	}
	nf.register(cmd)
	cmd.Flags().IntVar(&from, "from", 0, "the shard count before the split (default: the stream's; required on a rerun after the stream was split)")
	cmd.Flags().IntVar(&to, "to", 0, "the new shard count, a multiple of the current one")
	cmd.Flags().StringArrayVar(&urls, "database-url", nil, "a shard's Postgres URL, once per shard of the new count, in order from shard 0 (the old shards first)")
	cmd.Flags().IntVar(&batch, "batch", 500, "items moved per transaction")
	cmd.Flags().BoolVar(&dry, "dry-run", false, "count the items that would move; change nothing")
	return cmd
}

func writeSplit(g *globals, rep shards.SplitReport) error {
	moved := "moved"
	if rep.DryRun {
		moved = "would move"
	}
	t := newTable(g.stdout, "FROM SHARD", "TO SHARD", "ITEMS")
	total := 0
	for _, m := range rep.Moved {
		t.row(strconv.Itoa(m.From), strconv.Itoa(m.To), strconv.Itoa(m.Items))
		total += m.Items
	}
	if err := t.flush(); err != nil {
		return err
	}
	switch {
	case rep.DryRun:
		fmt.Fprintf(g.stdout, "Dry run: %d item(s) would move from %d to %d shards; nothing changed.\n", total, rep.From, rep.To)
		return nil
	case rep.Split:
		fmt.Fprintf(g.stdout, "RETRIES split from %d to %d shards at sequence %d.\n", rep.From, rep.To, rep.Sequence)
	default:
		fmt.Fprintf(g.stdout, "RETRIES was already split into %d shards; the old shards applied up to sequence %d.\n", rep.To, rep.Sequence)
	}
	fmt.Fprintf(g.stdout, "%d item(s) %s. Now start the schedulers of the new shards %s (RETRYD_SHARDS=%d, RETRYD_SHARD=<shard>, each its database) and restart the old shards %s with RETRYD_SHARDS=%d.\n",
		total, moved, shardRange(rep.From, rep.To-1), rep.To, shardRange(0, rep.From-1), rep.To)
	return nil
}

// shardRange names shards from to to: "1", "2-3".
func shardRange(from, to int) string {
	if from == to {
		return strconv.Itoa(from)
	}
	return strconv.Itoa(from) + "-" + strconv.Itoa(to)
}
