package main

import (
	"context"
	"fmt"
	"os"
	"slices"
	"sync"
	"time"

	"github.com/retryd/retryd/internal/wait"
	"github.com/retryd/retryd/pkg/contract"
	"github.com/retryd/retryd/services/scheduler"
)

func init() {
	register("recovery", "kill -9 the scheduler binary with P pending and restart: time to first due, to steady lateness; lost and duplicate due events", runRecovery)
}

// receipt is one due event as the owner got it.
type receipt struct {
	at, dueAt time.Time
}

// ledger counts due events by (kind, id, attempt) at the owner.
type ledger struct {
	mu          sync.Mutex
	seqs        map[string][]uint64 // key -> distinct stream sequences
	redelivered int                 // same stream message delivered again
	receipts    []receipt
}

func newLedger() *ledger { return &ledger{seqs: map[string][]uint64{}} }

func dueKey(kind, id string, attempt int) string {
	return kind + "/" + id + "/" + fmt.Sprint(attempt)
}

func (l *ledger) add(kind string, ev dueEvent) {
	k := dueKey(kind, ev.data.ID, ev.data.Attempt)
	l.mu.Lock()
	defer l.mu.Unlock()
	l.receipts = append(l.receipts, receipt{at: ev.receivedAt, dueAt: ev.data.NextAttemptAt})
	if slices.Contains(l.seqs[k], ev.streamSeq) {
		l.redelivered++
		return
	}
	l.seqs[k] = append(l.seqs[k], ev.streamSeq)
}

func (l *ledger) has(k string) bool {
	l.mu.Lock()
	defer l.mu.Unlock()
	return len(l.seqs[k]) > 0
}

// duplicates are keys published more than once as distinct stream
// messages: a due event JetStream did not absorb by its Nats-Msg-Id.
func (l *ledger) duplicates() int {
	l.mu.Lock()
	defer l.mu.Unlock()
	n := 0
	for _, s := range l.seqs {
		n += len(s) - 1
	}
	return n
}

func runRecovery(ctx context.Context, env Env) error {
	s := env.Sizes
	bin, err := schedulerBinary(ctx, env)
	if err != nil {
		return err
	}
	r, err := startRetryd(ctx, env, true)
	if err != nil {
		return err
	}
	defer r.close(ctx)
	bg := pendingRows{kind: kindBG, n: s.RecoverPending, from: backgroundStart(s.RecoverPending), span: time.Hour}
	loadStart := time.Now()
	if err := copyPending(ctx, r.db.pool, bg); err != nil {
		return err
	}
	fmt.Fprintf(env.Out, "%s pending (COPY, over the next hour) loaded in %s; probe %d/s failed -> due %s later\n",
		count(bg.n), time.Since(loadStart).Round(100*time.Millisecond), s.Probe.rate, s.Probe.delay)

	logDir, err := os.MkdirTemp("", "retryd-bench-logs-")
	if err != nil {
		return err
	}
	cleanupDirs.add(logDir)
	proc, err := startSchedProc(bin, r.db.url, r.ns.url(), logDir)
	if err != nil {
		return err
	}
	defer func() { proc.stop(30 * time.Second) }()
	if err := proc.waitReady(ctx, 60*time.Second); err != nil {
		return err
	}
	readyAt := time.Now()

	led := newLedger()
	// decided is when each probe failure was decided: its due time minus
	// the probe policy's fixed delay, by the database clock.
	var (
		decidedMu sync.Mutex
		decided   = map[string]time.Time{}
	)
	own := func(kind string) (func(), error) {
		return r.ownDue(ctx, kind, func(ev dueEvent) {
			led.add(kind, ev)
			if kind == kindProbe {
				decidedMu.Lock()
				if _, ok := decided[ev.data.ID]; !ok {
					decided[ev.data.ID] = ev.data.NextAttemptAt.Add(-probeDelay)
				}
				decidedMu.Unlock()
			}
			if !ev.redelivery {
				_ = r.publishSucceeded(ctx, kind, ev.data.ID, ev.data.Attempt, nil)
			}
		})
	}
	stopProbe, err := own(kindProbe)
	if err != nil {
		return err
	}
	defer stopProbe()
	stopBG, err := own(kindBG)
	if err != nil {
		return err
	}
	defer stopBG()

	// The probe runs through the kill and the restart; failures reported
	// while the scheduler is dead wait in RETRIES.
	var (
		idsMu     sync.Mutex
		probeIDs  []string
		pubErrors int
		seq       int64
	)
	// report publishes a probe failure and records its id once stored.
	report := func(id string) error {
		return r.publishFailed(ctx, kindProbe, id, func(err error) {
			idsMu.Lock()
			defer idsMu.Unlock()
			if err != nil {
				pubErrors++
				return
			}
			probeIDs = append(probeIDs, id)
		})
	}
	total := 2*s.RecoverSteady + s.RecoverDown
	probeDone := make(chan error, 1)
	go func() {
		_, err := pace(ctx, s.Probe.rate, total, func(n int) error {
			for range n {
				seq++
				if err := report(itemID("p", time.Now(), seq)); err != nil {
					return err
				}
			}
			return nil
		})
		probeDone <- err
	}()
	if err := wait.Sleep(ctx, s.RecoverSteady); err != nil {
		return err
	}
	var pendingAtKill int64
	_ = r.db.pool.QueryRow(ctx, "SELECT count(*) FROM retries WHERE state = 'scheduled'").Scan(&pendingAtKill)
	// A burst just before the kill: the scheduler is handed as many facts
	// as it may hold, which a kill leaves unacked. Before the short ack
	// wait, they and every fact behind them waited 30 s.
	for i := range killBurst {
		if err := report(itemID("k", time.Now(), int64(i))); err != nil {
			return err
		}
	}
	heldAtKill := r.waitHeld(ctx, scheduler.DefaultConsumeBatch, 5*time.Second)
	killAt := time.Now()
	proc.kill9()
	if err := wait.Sleep(ctx, s.RecoverDown); err != nil {
		return err
	}
	proc2, err := startSchedProc(bin, r.db.url, r.ns.url(), logDir)
	if err != nil {
		return err
	}
	proc = proc2
	restartAt := proc2.started
	readyErr := proc2.waitReady(ctx, 60*time.Second)
	readyIn := time.Since(restartAt)
	if readyErr != nil {
		return readyErr
	}
	if err := <-probeDone; err != nil {
		return err
	}
	probeEnd := time.Now()

	// Everything reported or due by the end of the probe must arrive.
	idsMu.Lock()
	want := slices.Clone(probeIDs)
	idsMu.Unlock()
	bgDue := bg.dueBy(probeEnd)
	missing := func() (probe, back int) {
		for _, id := range want {
			if !led.has(dueKey(kindProbe, id, 2)) {
				probe++
			}
		}
		for i := range bgDue {
			if !led.has(dueKey(kindBG, bg.id(i), 2)) {
				back++
			}
		}
		return probe, back
	}
	waitFor(ctx, s.Probe.delay+60*time.Second, func() bool { p, b := missing(); return p == 0 && b == 0 })
	lostProbe, lostBG := missing()

	// Time to the first due event only the new process can have sent (due
	// after the kill), and to steady lateness: from then on every 250 ms
	// window's p99 stays under the target.
	led.mu.Lock()
	rs := slices.Clone(led.receipts)
	redelivered := led.redelivered
	led.mu.Unlock()
	var first time.Duration = -1
	var before []time.Duration
	for _, rc := range rs {
		if rc.at.Before(killAt) && rc.dueAt.After(readyAt) {
			before = append(before, rc.at.Sub(rc.dueAt))
		}
		if rc.dueAt.After(killAt) && rc.at.After(restartAt) {
			if d := rc.at.Sub(restartAt); first < 0 || d < first {
				first = d
			}
		}
	}
	steady, worstAfter := steadyAfter(rs, restartAt, probeEnd, latenessTarget)
	pre := summarize(before)
	dups := led.duplicates()
	around, fromRestart := decisionDelays(want, decided, &decidedMu, killAt, restartAt)

	params := map[string]any{"pending": bg.n}
	env.rec.addDuration("recovery", "retryd", "first_due_after_restart", first, params)
	env.rec.addDuration("recovery", "retryd", "steady_after_restart", steady, params)
	env.rec.addDuration("recovery", "retryd", "decision_p99_around_kill", around.P99, params)
	env.rec.addDuration("recovery", "retryd", "decision_p99_from_restart", fromRestart.P99, params)
	env.rec.add("recovery", "retryd", "lost", float64(lostProbe+lostBG), "items", params)
	env.rec.add("recovery", "retryd", "duplicates", float64(dups), "items", params)

	t := newTable("figure", "value")
	t.row("pending at kill (state scheduled)", fmt.Sprint(pendingAtKill))
	t.row(fmt.Sprintf("facts the killed process held unacked (after a burst of %d)", killBurst), fmt.Sprint(heldAtKill))
	t.row("down for", s.RecoverDown.String())
	t.row("restart to /readyz", ms(readyIn))
	t.row("restart to first due (due after the kill)", ms(first))
	t.row("restart to steady lateness (p99 < 100 ms in every later 250 ms window)", fmtSteady(steady))
	t.row("worst lateness after restart", ms(worstAfter))
	t.row("p99 lateness before the kill", ms(pre.P99))
	t.row(fmt.Sprintf("failures reported %s around the kill (%d): report to decision p50 / p99", aroundKill, around.N),
		ms(around.P50)+" / "+ms(around.P99))
	t.row("  the same, counted from the restart for those reported while down: p50 / p99 (target p99 < 3 s)",
		ms(fromRestart.P50)+" / "+ms(fromRestart.P99))
	t.row("probe items reported / lost", fmt.Sprintf("%d / %d", len(want), lostProbe))
	t.row("background due by the end / lost", fmt.Sprintf("%d / %d", bgDue, lostBG))
	t.row("duplicate due events (distinct messages, same id+attempt)", fmt.Sprint(dups))
	t.row("consumer redeliveries (same message, not duplicates)", fmt.Sprint(redelivered))
	t.row("probe publish errors", fmt.Sprint(pubErrors))
	fmt.Fprintln(env.Out)
	t.print(env.Out)
	fmt.Fprintf(env.Out, "lost %d, duplicates %d (target 0 and 0): %s\n", lostProbe+lostBG, dups, verdict(lostProbe+lostBG == 0 && dups == 0))
	fmt.Fprintf(env.Out, "durability: %s\n", r.durability(ctx))
	return nil
}

// killBurst is how many failures are reported at once just before the
// kill.
const killBurst = 5000

// waitHeld waits until the scheduler's consumer has at least n facts out
// unacked, or timeout, and returns how many it has.
func (r *retrydSys) waitHeld(ctx context.Context, n int, timeout time.Duration) int {
	held := 0
	waitFor(ctx, timeout, func() bool {
		cons, err := r.ojs.Consumer(ctx, contract.StreamRetries, scheduler.ConsumerName)
		if err != nil {
			return false
		}
		info, err := cons.Info(ctx)
		if err != nil {
			return false
		}
		held = info.NumAckPending
		return held >= n
	})
	return held
}

// aroundKill is the span, centred on the kill, whose failures measure how
// soon new facts are decided again.
const aroundKill = 10 * time.Second

// decisionDelays returns, for the probe failures reported within
// aroundKill of the kill, the delay from report to decision, and the same
// delay counted from the restart for failures reported before it (the
// time it was down is not its fault). A fact the killed process held and
// never acked shows as a long delay here.
func decisionDelays(ids []string, decided map[string]time.Time, mu *sync.Mutex, killAt, restartAt time.Time) (around, fromRestart summary) {
	mu.Lock()
	defer mu.Unlock()
	var a, u []time.Duration
	for _, id := range ids {
		at := itemTime(id)
		if at.Before(killAt.Add(-aroundKill/2)) || at.After(killAt.Add(aroundKill/2)) {
			continue
		}
		d, ok := decided[id]
		if !ok {
			continue // counted as lost above
		}
		a = append(a, d.Sub(at))
		u = append(u, d.Sub(maxTime(at, restartAt)))
	}
	return summarize(a), summarize(u)
}

func maxTime(a, b time.Time) time.Time {
	if a.After(b) {
		return a
	}
	return b
}

// steadyAfter finds the first 250 ms window after restart from which every
// window up to end has p99 lateness under target; it returns its offset
// from restart (-1 if never) and the worst lateness seen after restart.
func steadyAfter(rs []receipt, restart, end time.Time, target time.Duration) (time.Duration, time.Duration) {
	const w = 250 * time.Millisecond
	n := int(end.Sub(restart)/w) + 1
	buckets := make([][]time.Duration, n)
	var worst time.Duration
	for _, rc := range rs {
		if rc.at.Before(restart) || !rc.at.Before(end) {
			continue
		}
		late := rc.at.Sub(rc.dueAt)
		worst = max(worst, late)
		i := int(rc.at.Sub(restart) / w)
		buckets[i] = append(buckets[i], late)
	}
	steady := -1
	for i := n - 1; i >= 0; i-- {
		if len(buckets[i]) == 0 {
			continue
		}
		if summarize(buckets[i]).P99 >= target {
			break
		}
		steady = i
	}
	if steady < 0 {
		return -1, worst
	}
	return time.Duration(steady) * w, worst
}

func fmtSteady(d time.Duration) string {
	if d < 0 {
		return "not reached"
	}
	return ms(d)
}
