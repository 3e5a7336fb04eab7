package main

import (
	"context"
	"errors"
	"fmt"
	"os"
	"runtime/pprof"
	"sync"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/nats-io/nats-server/v2/server"
)

// costProbe reads the counters of one system run at the start and the end
// of its measured window, and profiles the bench process's CPU in between.
type costProbe struct {
	pg     *pgServer
	db     string      // the system's database
	ns     *natsServer // nil for a system without NATS (River)
	system string
	run    int
	prefix string // --cycles-profile; "" keeps the profile in memory only

	conn       *pgx.Conn
	postmaster int // 0: Postgres CPU unavailable
	pmErr      error

	// mu is held by begin for its reading, so abort cannot close the
	// connection under it; closed makes a late begin do nothing.
	mu       sync.Mutex
	begun    chan struct{}
	start    counters
	profile  *cpuProfile
	startErr error
	closed   bool
}

// newCostProbe connects to the admin database; the connection and its
// queries stay in the admin database, outside the system's statements.
func newCostProbe(ctx context.Context, pg *pgServer, db string, ns *natsServer, system string, run int, prefix string) (*costProbe, error) {
	conn, err := pgx.Connect(ctx, pg.admin)
	if err != nil {
		return nil, fmt.Errorf("connect to postgres: %w", err)
	}
	p := &costProbe{pg: pg, db: db, ns: ns, system: system, run: run, prefix: prefix, conn: conn, begun: make(chan struct{})}
	p.postmaster, p.pmErr = pg.postmasterPID(ctx)
	return p, nil
}

// begin reads the counters as the window opens. The meter calls it from a
// goroutine of its own, so the owner callback that opened the window is
// not held up.
func (p *costProbe) begin(ctx context.Context) {
	p.mu.Lock()
	defer p.mu.Unlock()
	defer close(p.begun)
	if p.closed {
		return
	}
	p.start, p.startErr = p.read(ctx)
	// After the reads, so the profile holds the window and not the probe.
	p.profile = startCPUProfile()
}

// abort ends the probe of a run that failed: it stops the profile begin
// started (Go has one at a time, and the next run wants its own) and
// closes the connection. After end it does nothing.
func (p *costProbe) abort(ctx context.Context) {
	p.mu.Lock()
	defer p.mu.Unlock()
	if p.closed {
		return
	}
	p.closed = true
	if p.profile != nil && p.profile.err == nil {
		pprof.StopCPUProfile()
	}
	p.close(ctx)
}

// end reads the counters as the window closes and returns the window's
// cost; completed and dur are the meter's.
func (p *costProbe) end(ctx context.Context, completed int, dur time.Duration) (costRun, []string) {
	<-p.begun
	p.mu.Lock()
	defer p.mu.Unlock()
	defer p.close(ctx)
	p.closed = true
	prof, start, startErr := p.profile, p.start, p.startErr
	var notes []string
	split, err := prof.stop(p.path())
	if err != nil {
		notes = append(notes, "CPU split unavailable: "+err.Error())
	}
	c, err := p.read(ctx)
	if err = errors.Join(startErr, err); err != nil {
		notes = append(notes, "counters: "+err.Error())
	}
	return costRun{delta: c.sub(start), dur: dur, completed: completed, cpuSplit: split}, notes
}

func (p *costProbe) path() string {
	if p.prefix == "" {
		return ""
	}
	return fmt.Sprintf("%s-%s-run%d.pprof", p.prefix, p.system, p.run)
}

func (p *costProbe) close(ctx context.Context) {
	_ = p.conn.Close(context.WithoutCancel(ctx))
}

// read takes one reading. What cannot be read stays unavailable; a failed
// query on a server that should answer it is also reported, after the
// other counters are read.
func (p *costProbe) read(ctx context.Context) (counters, error) {
	var errs []error
	var c counters
	if self, err := readProcStat(os.Getpid()); err == nil {
		c.set(costBenchCPU, int64(self.ownTicks()))
	}
	if p.postmaster > 0 {
		if pm, err := readProcStat(p.postmaster); err == nil {
			if kids, err := childrenOf(p.postmaster); err == nil {
				c.set(costPostgresCPU, int64(treeTicks(pm, kids)))
			}
		}
	}
	if p.pg.noStatements == "" {
		var n int64
		err := p.conn.QueryRow(ctx, `SELECT coalesce(sum(s.calls), 0)::bigint
			FROM pg_stat_statements s JOIN pg_database d ON d.oid = s.dbid WHERE d.datname = $1`, p.db).Scan(&n)
		if err != nil {
			errs = append(errs, fmt.Errorf("read pg_stat_statements: %w", err))
		} else {
			c.set(costStatements, n)
		}
	}
	var xacts, rows, wal int64
	err := p.conn.QueryRow(ctx, `SELECT xact_commit + xact_rollback, tup_inserted + tup_updated + tup_deleted,
			pg_wal_lsn_diff(pg_current_wal_lsn(), '0/0')::bigint
		FROM pg_stat_database WHERE datname = $1`, p.db).Scan(&xacts, &rows, &wal)
	if err != nil {
		errs = append(errs, fmt.Errorf("read pg_stat_database: %w", err))
	} else {
		c.set(costXacts, xacts)
		c.set(costRowsWritten, rows)
		c.set(costWALBytes, wal)
	}
	if p.ns != nil {
		if err := p.readNATS(&c); err != nil {
			errs = append(errs, err)
		}
	}
	return c, errors.Join(errs...)
}

// readNATS reads the server's own view (no client round trips, which
// would add to the bytes counted).
func (p *costProbe) readNATS(c *counters) error {
	vz, err := p.ns.srv.Varz(nil)
	if err != nil {
		return fmt.Errorf("read nats varz: %w", err)
	}
	c.set(costNATSBytes, vz.InBytes+vz.OutBytes)
	jsz, err := p.ns.srv.Jsz(&server.JSzOptions{Streams: true, Accounts: true})
	if err != nil {
		return fmt.Errorf("read jetstream state: %w", err)
	}
	var msgs, bytes int64
	for _, acc := range jsz.AccountDetails {
		for _, st := range acc.Streams {
			// Streams keep messages for days (limits retention), so the
			// last sequence counts the messages stored in the window and
			// the bytes only grow.
			msgs += int64(st.State.LastSeq)
			bytes += int64(st.State.Bytes)
		}
	}
	c.set(costJSMsgs, msgs)
	c.set(costJSBytes, bytes)
	return nil
}

// measureCost has meter read the costs of its window: the first reading as
// the window opens, the second when finish is called once the window is
// over. A run that fails before that defers abort. A probe that cannot
// start leaves the figures unavailable, not the run failed.
func measureCost(ctx context.Context, env Env, meter *cycleMeter, db string, ns *natsServer, system string) (finish func(*cycleResult), abort func()) {
	if env.cycleRun == 0 {
		// Not the cycles scenario (growth runs cycles too).
		return func(*cycleResult) {}, func() {}
	}
	p, err := newCostProbe(ctx, env.pg, db, ns, system, env.cycleRun, env.CyclesProfile)
	if err != nil {
		return func(res *cycleResult) { res.costNotes = append(res.costNotes, "cost probe: "+err.Error()) }, func() {}
	}
	meter.onOpen = func() { p.begin(ctx) }
	abort = func() { p.abort(ctx) }
	return func(res *cycleResult) {
		run, notes := p.end(ctx, res.completed, res.dur)
		res.cost, res.costNotes = &run, append(res.costNotes, notes...)
		if p.pmErr != nil {
			res.costNotes = append(res.costNotes, "Postgres CPU unavailable: "+p.pmErr.Error())
		}
		if env.pg.noStatements != "" {
			res.costNotes = append(res.costNotes, "statements unavailable (pg_stat_statements: "+env.pg.noStatements+")")
		}
	}, abort
}
