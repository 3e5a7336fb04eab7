package main

import (
	"bufio"
	"bytes"
	"context"
	"fmt"
	"os"
	"strconv"
	"strings"
	"time"

	"github.com/jackc/pgx/v5/pgxpool"
	"github.com/nats-io/nats.go"

	"github.com/retryd/retryd/internal/streams"
	"github.com/retryd/retryd/pkg/contract"
	"github.com/retryd/retryd/services/scheduler"
)

// shardLayout is one deployment of the shards scenario: RETRIES split
// into shards, a database per shard on the run's Postgres server, and
// instances schedulers per shard.
type shardLayout struct {
	shards, instances int
}

func (l shardLayout) String() string {
	s := fmt.Sprintf("%d shard", l.shards)
	if l.shards > 1 {
		s += "s"
	}
	if l.instances > 1 {
		s += fmt.Sprintf(", %d instances", l.instances)
	}
	return s
}

// shardedRetryd is retryd split into shards as the bench runs it in
// process: one NATS server, every scheduler on its own connection and
// pool, and the owner of retrydSys, whose due consumers read every
// shard's token (contract.RetryFilter ends in '>').
type shardedRetryd struct {
	*retrydSys
	layout shardLayout
	dbs    []*retrydDB // by shard; dbs[0] is also retrydSys.db
	scheds []*scheduler.Scheduler
	ncs    []*nats.Conn
	pools  []*pgxpool.Pool // of the instances after the first on a shard
}

func startSharded(ctx context.Context, env Env, l shardLayout) (_ *shardedRetryd, err error) {
	s := &shardedRetryd{retrydSys: &retrydSys{env: env}, layout: l}
	defer func() {
		if err != nil {
			s.close(ctx)
		}
	}()
	r := s.retrydSys
	if r.ns, err = startNATS(env.NATSSync); err != nil {
		return nil, err
	}
	if err := streams.Ensure(ctx, r.ns.js, streams.Options{Shards: l.shards}); err != nil {
		return nil, fmt.Errorf("ensure streams split into %d: %w", l.shards, err)
	}
	for range l.shards {
		db, err := newRetrydDB(ctx, env.pg)
		if err != nil {
			return nil, err
		}
		s.dbs = append(s.dbs, db)
	}
	r.db = s.dbs[0]
	if r.owner, r.ojs, err = r.ns.connect("bench-owner"); err != nil {
		return nil, err
	}
	r.pub = newAsyncPublisher(r.ojs)
	for k, db := range s.dbs {
		for i := range l.instances {
			pool := db.pool
			if i > 0 {
				// A second instance is a second process: its own pool.
				if pool, err = newPool(ctx, db.url, 20); err != nil {
					return nil, err
				}
				s.pools = append(s.pools, pool)
			}
			labelled(ctx, compScheduler, func(ctx context.Context) { err = s.startInstance(ctx, k, pool) })
			if err != nil {
				return nil, fmt.Errorf("shard %d instance %d: %w", k, i+1, err)
			}
		}
	}
	return s, nil
}

func (s *shardedRetryd) startInstance(ctx context.Context, shard int, pool *pgxpool.Pool) error {
	nc, js, err := s.ns.connect(fmt.Sprintf("retryd-scheduler-%d", shard))
	if err != nil {
		return err
	}
	s.ncs = append(s.ncs, nc)
	cfg := schedulerConfig(pool, js, s.logged.logger())
	cfg.Shards, cfg.Shard = s.layout.shards, shard
	sch, err := scheduler.New(cfg)
	if err != nil {
		return fmt.Errorf("new scheduler: %w", err)
	}
	if err := sch.Start(ctx); err != nil {
		return fmt.Errorf("start scheduler: %w", err)
	}
	s.scheds = append(s.scheds, sch)
	return nil
}

func (s *shardedRetryd) close(ctx context.Context) {
	for _, sch := range s.scheds {
		stopCtx, cancel := context.WithTimeout(context.WithoutCancel(ctx), 30*time.Second)
		_ = sch.Stop(stopCtx)
		cancel()
	}
	if len(s.scheds) > 0 {
		fmt.Fprintf(s.env.Out, "    %s, %d scheduler(s) in process: %s\n", s.layout, len(s.scheds), &s.logged)
	}
	for _, nc := range s.ncs {
		nc.Close()
	}
	for _, p := range s.pools {
		p.Close()
	}
	for _, db := range s.dbs[min(1, len(s.dbs)):] {
		db.close(ctx)
	}
	s.retrydSys.close(ctx) // the owner, dbs[0], NATS
}

// background loads n pending rows of kindBG spread over the next hour,
// each into the database of the shard contract.Shard places it on, and
// starts their owner.
func (s *shardedRetryd) background(ctx context.Context, n int) (stop func(), err error) {
	p := pendingRows{kind: kindBG, n: n, from: backgroundStart(n), span: time.Hour}
	for k, db := range s.dbs {
		p.keep = func(id string) bool { return contract.Shard(kindBG, id, len(s.dbs)) == k }
		if err := copyPending(ctx, db.pool, p); err != nil {
			return nil, fmt.Errorf("shard %d: %w", k, err)
		}
	}
	return s.ownBackground(ctx, kindBG)
}

// cpuTimes is a reading of the machine's CPU time from /proc/stat.
type cpuTimes struct {
	busy, total uint64
	cpus        int
}

func readCPUTimes() (cpuTimes, error) {
	b, err := os.ReadFile("/proc/stat")
	if err != nil {
		return cpuTimes{}, fmt.Errorf("read /proc/stat: %w", err)
	}
	return parseCPUTimes(b)
}

// parseCPUTimes reads the summary "cpu" line (user nice system idle
// iowait irq softirq steal, in ticks) and counts the cpuN lines. Idle and
// iowait are not busy.
func parseCPUTimes(b []byte) (cpuTimes, error) {
	var c cpuTimes
	sc := bufio.NewScanner(bytes.NewReader(b))
	for sc.Scan() {
		f := strings.Fields(sc.Text())
		switch {
		case len(f) > 0 && f[0] == "cpu":
			for i, v := range f[1:min(len(f), 9)] {
				n, err := strconv.ParseUint(v, 10, 64)
				if err != nil {
					return cpuTimes{}, fmt.Errorf("parse /proc/stat cpu line: %w", err)
				}
				c.total += n
				if i != 3 && i != 4 {
					c.busy += n
				}
			}
		case len(f) > 0 && strings.HasPrefix(f[0], "cpu"):
			c.cpus++
		}
	}
	if c.total == 0 || c.cpus == 0 {
		return cpuTimes{}, fmt.Errorf("no cpu line in /proc/stat")
	}
	return c, nil
}

// coresBusy is how many of the machine's cores were busy on average from
// a to b.
func coresBusy(a, b cpuTimes) float64 {
	if b.total <= a.total {
		return 0
	}
	return float64(b.busy-a.busy) / float64(b.total-a.total) * float64(b.cpus)
}
