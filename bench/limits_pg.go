package main

import (
	"context"
	"fmt"
	"sync"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgxpool"
)

// The tables of the Postgres limits: lim_history is shaped like
// retry_history (what a cycle appends), lim_items like retries (what a
// cycle updates in place).
const limitsSchema = `
CREATE TABLE lim_commit (id bigint GENERATED ALWAYS AS IDENTITY PRIMARY KEY, v text NOT NULL);
CREATE TABLE lim_history (
    id bigint GENERATED ALWAYS AS IDENTITY PRIMARY KEY,
    kind text NOT NULL, item_id text NOT NULL, attempt integer NOT NULL, event text NOT NULL,
    error_class text NOT NULL DEFAULT '', error_message text NOT NULL DEFAULT '',
    detail jsonb NOT NULL DEFAULT '{}', msg_id text NOT NULL DEFAULT '', at timestamptz NOT NULL DEFAULT now());
CREATE INDEX lim_history_item_idx ON lim_history (kind, item_id, id);
CREATE TABLE lim_items (id text PRIMARY KEY, state text NOT NULL, attempt integer NOT NULL, due_at timestamptz NOT NULL);
CREATE INDEX lim_items_due_idx ON lim_items (due_at) WHERE state = 'pending';
INSERT INTO lim_items SELECT 'item-' || g, 'pending', 1, now() + interval '1 hour' FROM generate_series(1, 100000) g;
`

const limitsBatch = 1000

func postgresLimits(ctx context.Context, env Env, dur time.Duration) ([]limit, string, error) {
	name := dbName("limits")
	url, err := env.pg.createDB(ctx, name)
	if err != nil {
		return nil, "", err
	}
	defer env.pg.dropDB(context.WithoutCancel(ctx), name)
	pool, err := newPool(ctx, url, 16)
	if err != nil {
		return nil, "", err
	}
	defer pool.Close()
	if _, err := pool.Exec(ctx, limitsSchema); err != nil {
		return nil, "", fmt.Errorf("create limits tables: %w", err)
	}
	var out []limit
	for _, m := range []struct {
		op, unit, how string
		conns, per    int
		run           func(ctx context.Context, c *pgxpool.Conn, i int) error
	}{
		{"commit, 1 connection", "commits/s", "INSERT of one row per transaction", 1, 1, commitOne},
		{"commit, 8 connections", "commits/s", "the same from 8 connections (group commit)", 8, 1, commitOne},
		{"insert, batches of 1000", "rows/s", "INSERT … SELECT FROM unnest, a history-shaped row, one statement per transaction", 1, limitsBatch, insertBatch},
		{"update, batches of 1000", "rows/s", "UPDATE … FROM unnest by primary key, one statement per transaction", 1, limitsBatch, updateBatch},
		{"COPY, 10000 rows", "rows/s", "COPY of history-shaped rows, one per transaction", 1, 10 * limitsBatch, copyBatch},
	} {
		ops, err := forDuration(ctx, pool, m.conns, dur, m.run)
		if err != nil {
			return nil, "", fmt.Errorf("%s: %w", m.op, err)
		}
		out = append(out, limit{"Postgres", m.op, float64(ops*m.per) / dur.Seconds(), m.unit, m.how})
	}
	return out, durability(ctx, pool), nil
}

// forDuration runs op on conns connections until dur passes and returns
// how many calls completed.
func forDuration(ctx context.Context, pool *pgxpool.Pool, conns int, dur time.Duration,
	op func(ctx context.Context, c *pgxpool.Conn, i int) error) (int, error) {
	var (
		mu    sync.Mutex
		total int
		first error
		wg    sync.WaitGroup
	)
	end := time.Now().Add(dur)
	for w := range conns {
		wg.Go(func() {
			c, err := pool.Acquire(ctx)
			if err == nil {
				defer c.Release()
			}
			n := 0
			for ; err == nil && time.Now().Before(end); n++ {
				err = op(ctx, c, w*1_000_000+n)
			}
			mu.Lock()
			defer mu.Unlock()
			total += n
			if err != nil && first == nil {
				first = err
			}
		})
	}
	wg.Wait()
	return total, first
}

func commitOne(ctx context.Context, c *pgxpool.Conn, i int) error {
	_, err := c.Exec(ctx, "INSERT INTO lim_commit (v) VALUES ($1)", fmt.Sprint(i))
	return err
}

func historyColumns(i, n int) (items []string, attempts []int32) {
	items, attempts = make([]string, n), make([]int32, n)
	for j := range n {
		items[j], attempts[j] = fmt.Sprintf("item-%d", (i*n+j)%100000+1), int32(j%5+1)
	}
	return items, attempts
}

func insertBatch(ctx context.Context, c *pgxpool.Conn, i int) error {
	items, attempts := historyColumns(i, limitsBatch)
	_, err := c.Exec(ctx, `INSERT INTO lim_history (kind, item_id, attempt, event, error_class, error_message, msg_id)
SELECT 'job', item, attempt, 'failed', 'network', 'connection reset by peer', 'retry-failed:job:' || item || ':' || attempt
FROM unnest($1::text[], $2::int[]) AS u(item, attempt)`, items, attempts)
	return err
}

func updateBatch(ctx context.Context, c *pgxpool.Conn, i int) error {
	items, _ := historyColumns(i, limitsBatch)
	_, err := c.Exec(ctx, `UPDATE lim_items SET state = 'pending', attempt = attempt + 1, due_at = now() + interval '1 hour'
FROM unnest($1::text[]) AS u(id) WHERE lim_items.id = u.id`, items)
	return err
}

func copyBatch(ctx context.Context, c *pgxpool.Conn, i int) error {
	items, attempts := historyColumns(i, 10*limitsBatch)
	rows := make([][]any, len(items))
	for j := range items {
		rows[j] = []any{"job", items[j], attempts[j], "failed", "network", "connection reset by peer"}
	}
	_, err := c.CopyFrom(ctx, pgx.Identifier{"lim_history"},
		[]string{"kind", "item_id", "attempt", "event", "error_class", "error_message"}, pgx.CopyFromRows(rows))
	return err
}
