package main

import (
	"bytes"
	"context"
	"encoding/json"
	"fmt"
	"net/http"
	"net/http/httptest"
	"sort"
	"strconv"
	"strings"
	"time"

	"github.com/nats-io/nats.go"
	"github.com/nats-io/nats.go/jetstream"
	"github.com/prometheus/client_golang/prometheus"
	"github.com/rs/zerolog"

	"github.com/retryd/retryd/internal/serve"
	"github.com/retryd/retryd/pkg/contract"
	"github.com/retryd/retryd/services/ingress"
)

func init() {
	register("hold-release", "events held behind a paused source, then resumed: time until all are admitted, unlimited and under a rate limit (rate and order)", runHoldRelease)
}

// The rate limit of the paced phase; the quick run scales it down with the
// backlog so both phases stay short.
const (
	holdReleaseRate      = 10_000
	holdReleaseRateQuick = 1_000
)

// holdReleaseResult is one phase: n events held, then released.
type holdReleaseResult struct {
	n        int
	held     time.Duration // publish of the first event until the scheduler holds all n
	admitted time.Duration // resume until the last admission
	// closed is resume until the scheduler closed every event's retry
	// (applied its succeeded); the next phase starts only then.
	closed time.Duration
	// rate is admissions per second from the first admission to the last.
	rate float64
	// steady is the rate over the whole windows between the first and the
	// last admission (the partial first and last windows left out).
	steady float64
	// outOfPlace is how many events must move for the admissions to be in
	// sequence order (n minus the longest increasing run of sequence
	// numbers); maxBehind is the farthest one event came after its place.
	outOfPlace, maxBehind int
	fullest               int   // most admissions in one rate window (paced phase)
	windows               []int // admissions per window, first to last (paced phase)
	// waitsPerEvent is dues handed back to wait for their turn per event;
	// dueLate and admitLate are the p99 of how long after its release
	// time (its slot, when paced) an event's due was emitted and the
	// event admitted.
	waitsPerEvent      float64
	dueLate, admitLate time.Duration
}

// throttleFIFOResult is the acceptance run of ordered, paced release
// without a pause: a burst far over a source's rate limit.
type throttleFIFOResult struct {
	holdReleaseResult
	limit        int
	ideal        time.Duration // n / limit
	duesPerEvent float64
	// waitsPerEvent is how often a due was handed back to wait for its
	// turn (a redelivery of the same due, not a new one), per event.
	waitsPerEvent float64
	exhausted     int
}

func runHoldRelease(ctx context.Context, env Env) error {
	n, rate := env.Sizes.HoldEvents, holdReleaseRate
	if env.Quick {
		rate = holdReleaseRateQuick
	}
	fmt.Fprintf(env.Out, "%s events sent to a paused source (ingress and scheduler in process, embedded NATS), then the source resumed: unlimited, then with a rate limit of %d/s\n", count(n), rate)
	r, err := startRetryd(ctx, env, false)
	if err != nil {
		return err
	}
	defer r.close(ctx)
	nc, js, err := r.ns.connect("retryd-ingress")
	if err != nil {
		return err
	}
	defer nc.Close()
	reg := prometheus.NewRegistry()
	svc, err := ingress.New(ingress.Config{Pool: r.db.pool, JS: js, Logger: zerolog.Nop(), Registerer: reg})
	if err != nil {
		return fmt.Errorf("new ingress: %w", err)
	}
	if err := svc.Start(ctx); err != nil {
		return fmt.Errorf("start ingress: %w", err)
	}
	defer func() {
		stopCtx, cancel := context.WithTimeout(context.WithoutCancel(ctx), 30*time.Second)
		defer cancel()
		_ = svc.Stop(stopCtx)
	}()
	h := serve.Guard{}.Handler(svc.Handler()) // auth off: the operator calls are the bench's own

	unlimited, err := holdReleasePhase(ctx, env, r, h, reg, "hold-free", n, 0)
	if err != nil {
		return fmt.Errorf("unlimited: %w", err)
	}
	paced, err := holdReleasePhase(ctx, env, r, h, reg, "hold-paced", n, rate)
	if err != nil {
		return fmt.Errorf("rate limited: %w", err)
	}

	fifo, err := throttleFIFOPhase(ctx, env, r, h, reg)
	if err != nil {
		return fmt.Errorf("throttled burst: %w", err)
	}

	t := newTable("release", "events", "held in", "all admitted in", "closed in", "admissions/s", "steady/s", "out of place", "max behind", "fullest window",
		"handed back/event", "due late p99", "admitted late p99")
	for _, p := range []struct {
		name string
		res  holdReleaseResult
	}{{"resume, no limit", unlimited}, {fmt.Sprintf("resume, %d/s", rate), paced}} {
		fullest := "-"
		if p.res.fullest > 0 {
			fullest = strconv.Itoa(p.res.fullest)
		}
		t.row(p.name, count(p.res.n), p.res.held.Round(100*time.Millisecond).String(), ms(p.res.admitted), ms(p.res.closed),
			fmt.Sprintf("%.0f", p.res.rate), fmt.Sprintf("%.0f", p.res.steady),
			strconv.Itoa(p.res.outOfPlace), strconv.Itoa(p.res.maxBehind), fullest,
			fmt.Sprintf("%.2f", p.res.waitsPerEvent), ms(p.res.dueLate), ms(p.res.admitLate))
		params := map[string]any{"n": p.res.n, "phase": p.name}
		env.rec.addDuration("hold-release", "retryd", "admitted", p.res.admitted, params)
		env.rec.addDuration("hold-release", "retryd", "closed", p.res.closed, params)
		env.rec.add("hold-release", "retryd", "rate", p.res.rate, "events/s", params)
		env.rec.add("hold-release", "retryd", "steady_rate", p.res.steady, "events/s", params)
		env.rec.add("hold-release", "retryd", "out_of_place", float64(p.res.outOfPlace), "events", params)
		env.rec.add("hold-release", "retryd", "waits_per_event", p.res.waitsPerEvent, "waits", params)
		env.rec.addDuration("hold-release", "retryd", "due_late_p99", p.res.dueLate, params)
		env.rec.addDuration("hold-release", "retryd", "admitted_late_p99", p.res.admitLate, params)
	}
	fmt.Fprintln(env.Out)
	t.print(env.Out)
	within := paced.steady >= 0.95*float64(rate) && paced.steady <= 1.05*float64(rate)
	fmt.Fprintf(env.Out, "paced release at %d/s ±5%% (steady %.0f/s, never more than %d in a window): %s\n",
		rate, paced.steady, rate, verdict(within && paced.fullest <= rate))
	fmt.Fprintf(env.Out, "admissions per 1 s window of the paced release: %v\n", paced.windows)
	if unlimited.rate < float64(rate) {
		fmt.Fprintf(env.Out, "note: the gate admitted at most %.0f/s without a limit on this machine, below the %d/s limit: the machine, not the limit, paces the second phase\n",
			unlimited.rate, rate)
	}
	fmt.Fprintf(env.Out, "out of place: events that must move for the admissions on EVENTS to follow arrival order; the gate decides each source in arrival order (concurrency %d: sources at once)\n",
		ingress.DefaultConcurrency)
	fmt.Fprintf(env.Out, "\nthrottled burst: %s events sent at once to a source limited to %d/s (no pause): all admitted in %s (ideal %s), "+
		"%d out of place (max %d behind), at most %d in a window, %.2f due events per event (target <= 1.1), %.2f dues handed back to wait for their turn per event, %d exhausted: %s\n",
		count(fifo.n), fifo.limit, ms(fifo.admitted), ms(fifo.ideal), fifo.outOfPlace, fifo.maxBehind, fifo.fullest, fifo.duesPerEvent, fifo.waitsPerEvent, fifo.exhausted,
		verdict(fifo.fullest <= fifo.limit && fifo.duesPerEvent <= 1.1 && fifo.exhausted == 0))
	params := map[string]any{"n": fifo.n, "limit": fifo.limit}
	env.rec.addDuration("hold-release", "retryd", "throttled_burst_admitted", fifo.admitted, params)
	env.rec.add("hold-release", "retryd", "throttled_burst_dues_per_event", fifo.duesPerEvent, "dues", params)
	env.rec.add("hold-release", "retryd", "throttled_burst_out_of_place", float64(fifo.outOfPlace), "events", params)
	env.rec.add("hold-release", "retryd", "throttled_burst_waits_per_event", fifo.waitsPerEvent, "waits", params)
	fmt.Fprintf(env.Out, "durability: %s\n", r.durability(ctx))
	return nil
}

// holdReleasePhase pauses source (limit > 0: with that rate limit per
// second), sends n events to ingest.<source> with sequence numbers, waits
// until the scheduler holds every one, resumes the source and waits until
// every event is admitted.
func holdReleasePhase(ctx context.Context, env Env, r *retrydSys, h http.Handler, reg prometheus.Gatherer, source string, n, limit int) (holdReleaseResult, error) {
	res := holdReleaseResult{n: n}
	if limit > 0 {
		body := map[string]any{"rate_limit": limit, "rate_window": "1s"}
		if err := holdReleaseCall(h, http.MethodPut, "/v1/sources/"+source, body); err != nil {
			return res, err
		}
	}
	if err := holdReleaseCall(h, http.MethodPost, "/v1/sources/"+source+"/pause", map[string]any{"reason": "bench"}); err != nil {
		return res, err
	}
	start := time.Now()
	if err := publishSeq(ctx, r, source, n); err != nil {
		return res, err
	}
	if err := waitCount(ctx, r, n, 10*time.Minute, `SELECT count(*) FROM retries WHERE kind = 'event' AND hold_key = $1
		AND held_since IS NOT NULL AND state = 'scheduled'`, source); err != nil {
		return res, fmt.Errorf("wait for the scheduler to hold %d events: %w", n, err)
	}
	res.held = time.Since(start)
	fmt.Fprintf(env.Out, "  %s: %s events held in %s; resuming\n", source, count(n), res.held.Round(100*time.Millisecond))

	resumed := time.Now()
	if err := holdReleaseCall(h, http.MethodPost, "/v1/sources/"+source+"/resume", nil); err != nil {
		return res, err
	}
	if err := waitCount(ctx, r, n, 30*time.Minute, `SELECT count(*) FROM workflow_events WHERE source = $1 AND status = 'admitted'`, source); err != nil {
		return res, fmt.Errorf("wait for %d admissions: %w", n, err)
	}
	last, err := lastAdmission(ctx, r, source)
	if err != nil {
		return res, err
	}
	res.admitted = last.Sub(resumed)
	if err := waitCount(ctx, r, n, 30*time.Minute, `SELECT count(*) FROM retries WHERE kind = 'event' AND hold_key = $1
		AND state = 'succeeded'`, source); err != nil {
		return res, fmt.Errorf("wait for the scheduler to close %d retries: %w", n, err)
	}
	res.closed = time.Since(resumed)
	waited, err := counterValue(reg, "retryd_ingress_retries_total", map[string]string{"source": source, "event": "waited"})
	if err != nil {
		return res, err
	}
	res.waitsPerEvent = waited / float64(n)
	if err := holdReleaseLateness(ctx, r, source, &res); err != nil {
		return res, err
	}
	return res, holdReleaseOrder(ctx, r, source, limit, &res)
}

// holdReleaseLateness fills in how late, at p99, the scheduler's dues
// came after the time its release gave them (when it emits them), and
// how late ingress admitted each event after its time: its slot of the
// release's pace (the release fact on RETRIES), by its place in arrival
// order, or the release time without a pace. (Until 2026-11-26 the
// admission's time came from the scheduler's history row of the release,
// which it no longer writes for events ingress admits.)
func holdReleaseLateness(ctx context.Context, r *retrydSys, source string, res *holdReleaseResult) error {
	var dueMS float64
	err := r.db.pool.QueryRow(ctx, `
		SELECT coalesce(percentile_cont(0.99) WITHIN GROUP (ORDER BY extract(epoch FROM d.at - h.next_attempt_at)), 0) * 1000
		FROM retry_history h
		JOIN retry_history d ON d.kind = h.kind AND d.item_id = h.item_id AND d.event = 'due' AND d.attempt = h.attempt
		WHERE h.kind = 'event' AND h.source = $1 AND h.event = 'rescheduled' AND h.decided_by = 'resume'`, source).Scan(&dueMS)
	if err != nil {
		return fmt.Errorf("read release lateness: %w", err)
	}
	res.dueLate = time.Duration(dueMS * float64(time.Millisecond))
	stream, err := r.ojs.Stream(ctx, contract.StreamRetries)
	if err != nil {
		return fmt.Errorf("open %s: %w", contract.StreamRetries, err)
	}
	m, err := stream.GetLastMsgForSubject(ctx, contract.RetrySubject(contract.KindEvent, contract.Released, source))
	if err != nil {
		return fmt.Errorf("read the release of %s: %w", source, err)
	}
	ev, err := contract.DecodeLifecycle(m.Subject, m.Data)
	if err != nil || ev.Released == nil {
		return fmt.Errorf("decode the release of %s: %w", source, err)
	}
	rows, err := r.db.pool.Query(ctx, `SELECT admitted_at FROM workflow_events WHERE source = $1 AND status = 'admitted'
		ORDER BY ingest_seq, received_at, event_id`, source)
	if err != nil {
		return fmt.Errorf("read admissions: %w", err)
	}
	defer rows.Close()
	var late []time.Duration
	for rows.Next() {
		var at time.Time
		if err := rows.Scan(&at); err != nil {
			return fmt.Errorf("read admission: %w", err)
		}
		slot := ev.Released.ReleasedAt
		if p := ev.Released.Pace; p != nil {
			slot = p.SlotAt(len(late))
		}
		late = append(late, max(at.Sub(slot), 0))
	}
	if err := rows.Err(); err != nil {
		return fmt.Errorf("read admissions: %w", err)
	}
	if len(late) > 0 {
		sort.Slice(late, func(i, j int) bool { return late[i] < late[j] })
		res.admitLate = percentile(late, 0.99)
	}
	return nil
}

// holdReleaseOrder reads the admissions back in admitted_at order and
// fills in rates, order and the fullest window.
func holdReleaseOrder(ctx context.Context, r *retrydSys, source string, limit int, res *holdReleaseResult) error {
	rows, err := r.db.pool.Query(ctx, `SELECT event_id, admitted_at FROM workflow_events WHERE source = $1 AND status = 'admitted'
		ORDER BY admitted_at, event_id`, source)
	if err != nil {
		return fmt.Errorf("read admissions: %w", err)
	}
	defer rows.Close()
	var seqs []int
	var times []time.Time
	for rows.Next() {
		var id string
		var at time.Time
		if err := rows.Scan(&id, &at); err != nil {
			return fmt.Errorf("read admission: %w", err)
		}
		seq, err := strconv.Atoi(id[len(source)+1:])
		if err != nil {
			return fmt.Errorf("admitted event %q has no sequence number: %w", id, err)
		}
		seqs = append(seqs, seq)
		times = append(times, at)
	}
	if err := rows.Err(); err != nil {
		return fmt.Errorf("read admissions: %w", err)
	}
	if len(times) < 2 {
		return fmt.Errorf("%d admissions read back", len(times))
	}
	first, last := times[0], times[len(times)-1]
	res.rate = float64(len(times)-1) / last.Sub(first).Seconds()
	// Whole seconds strictly inside (first, last): the steady rate.
	from, to := first.Truncate(time.Second).Add(time.Second), last.Truncate(time.Second)
	perWindow := map[int64]int{}
	inside := 0
	for _, at := range times {
		perWindow[at.Unix()]++
		if !at.Before(from) && at.Before(to) {
			inside++
		}
	}
	if secs := to.Sub(from).Seconds(); secs >= 1 {
		res.steady = float64(inside) / secs
	} else {
		res.steady = res.rate
	}
	if limit > 0 {
		for _, c := range perWindow {
			res.fullest = max(res.fullest, c)
		}
		for sec := first.Unix(); sec <= last.Unix(); sec++ {
			res.windows = append(res.windows, perWindow[sec])
		}
	}
	// The order consumers see: EVENTS, by stream sequence. (admitted_at
	// cannot tell it: a release batch admits up to a thousand events in
	// one transaction, all at the same time.)
	if seqs, err = publishedOrder(ctx, r, source, len(seqs)); err != nil {
		return err
	}
	res.outOfPlace = len(seqs) - longestIncreasing(seqs)
	for i, s := range seqs {
		res.maxBehind = max(res.maxBehind, i-s)
	}
	return nil
}

// publishedOrder reads the n events of source back from the EVENTS
// stream, in stream order, and returns their sequence numbers (the
// number in each event id, source-<seq>).
func publishedOrder(ctx context.Context, r *retrydSys, source string, n int) ([]int, error) {
	c, err := r.ojs.OrderedConsumer(ctx, contract.StreamEvents, jetstream.OrderedConsumerConfig{
		FilterSubjects: []string{contract.EventSubject(source, ">")},
	})
	if err != nil {
		return nil, fmt.Errorf("read the published order: %w", err)
	}
	seqs := make([]int, 0, n)
	for len(seqs) < n {
		batch, err := c.Fetch(min(n-len(seqs), 1000), jetstream.FetchMaxWait(5*time.Second))
		if err != nil {
			return nil, fmt.Errorf("read the published order: %w", err)
		}
		got := 0
		for msg := range batch.Messages() {
			got++
			id := msg.Headers().Get(contract.HeaderMsgID)
			seq, err := strconv.Atoi(strings.TrimPrefix(id, source+"-"))
			if err != nil {
				return nil, fmt.Errorf("published event %q has no sequence number: %w", id, err)
			}
			seqs = append(seqs, seq)
		}
		if err := batch.Error(); err != nil {
			return nil, fmt.Errorf("read the published order: %w", err)
		}
		if got == 0 {
			return nil, fmt.Errorf("read the published order: %d of %d events on %s", len(seqs), n, contract.StreamEvents)
		}
	}
	return seqs, nil
}

// longestIncreasing is the length of the longest strictly increasing
// subsequence of s (patience sorting, n log n).
func longestIncreasing(s []int) int {
	var tails []int
	for _, v := range s {
		i := sort.SearchInts(tails, v)
		if i == len(tails) {
			tails = append(tails, v)
		} else {
			tails[i] = v
		}
	}
	return len(tails)
}

// lastAdmission is when source's last event was admitted, by the row's
// own time (the bench and Postgres share the machine's clock), not when a
// poll saw it.
func lastAdmission(ctx context.Context, r *retrydSys, source string) (time.Time, error) {
	var last time.Time
	if err := r.db.pool.QueryRow(ctx, `SELECT max(admitted_at) FROM workflow_events WHERE source = $1`, source).Scan(&last); err != nil {
		return time.Time{}, fmt.Errorf("read the last admission: %w", err)
	}
	return last, nil
}

// waitCountEvery is how often waitCount counts: a count over 100,000
// rows takes tens of milliseconds of the database, which the system under
// measure needs (every 50 ms, it took a third of a core). Times that
// matter are read from the rows' own timestamps, not from the poll.
const waitCountEvery = 500 * time.Millisecond

// waitCount polls query (one count, one argument) until it reaches n or
// limit passes, printing progress every 10 s.
func waitCount(ctx context.Context, r *retrydSys, n int, limit time.Duration, query string, arg any) error {
	deadline := time.Now().Add(limit)
	next := time.Now().Add(10 * time.Second)
	for {
		var got int
		if err := r.db.pool.QueryRow(ctx, query, arg).Scan(&got); err != nil {
			return fmt.Errorf("count: %w", err)
		}
		if got >= n {
			return nil
		}
		if time.Now().After(deadline) {
			return fmt.Errorf("%d of %d after %s", got, n, limit)
		}
		if time.Now().After(next) {
			fmt.Fprintf(r.env.Out, "    ... %d of %d\n", got, n)
			next = next.Add(10 * time.Second)
		}
		select {
		case <-ctx.Done():
			return ctx.Err()
		case <-time.After(waitCountEvery):
		}
	}
}

// holdReleaseCall calls the ingress operator API in process.
func holdReleaseCall(h http.Handler, method, path string, body any) error {
	var buf bytes.Buffer
	if body != nil {
		if err := json.NewEncoder(&buf).Encode(body); err != nil {
			return err
		}
	}
	// A loopback Host: with authentication off, h serves no other.
	req := httptest.NewRequest(method, "http://127.0.0.1"+path, &buf)
	req.Header.Set("Content-Type", "application/json")
	rec := httptest.NewRecorder()
	h.ServeHTTP(rec, req)
	if rec.Code/100 != 2 {
		return fmt.Errorf("%s %s: %d %s", method, path, rec.Code, bytes.TrimSpace(rec.Body.Bytes()))
	}
	return nil
}

// throttleFIFOPhase sends a burst of events at once to a source limited
// far below it (10,000 at 100/s; quick: 1,000 at 50/s) and checks the
// throttle's promise: all admitted in arrival order in about n/limit, none
// exhausted, each held event coming due about once (its own slot) rather
// than at every window edge.
func throttleFIFOPhase(ctx context.Context, env Env, r *retrydSys, h http.Handler, reg prometheus.Gatherer) (throttleFIFOResult, error) {
	const source = "hold-fifo"
	n, limit := env.Sizes.HoldBurst, 100
	if env.Quick {
		limit = 50
	}
	res := throttleFIFOResult{holdReleaseResult: holdReleaseResult{n: n}, limit: limit, ideal: time.Duration(n) * time.Second / time.Duration(limit)}
	if err := holdReleaseCall(h, http.MethodPut, "/v1/sources/"+source, map[string]any{"rate_limit": limit, "rate_window": "1s"}); err != nil {
		return res, err
	}
	start := time.Now()
	if err := publishSeq(ctx, r, source, n); err != nil {
		return res, err
	}
	fmt.Fprintf(env.Out, "  %s: %s events sent in %s to a source limited to %d/s\n", source, count(n), time.Since(start).Round(100*time.Millisecond), limit)
	if err := waitCount(ctx, r, n, res.ideal*3+5*time.Minute, `SELECT count(*) FROM workflow_events WHERE source = $1 AND status = 'admitted'`, source); err != nil {
		return res, fmt.Errorf("wait for %d admissions: %w", n, err)
	}
	last, err := lastAdmission(ctx, r, source)
	if err != nil {
		return res, err
	}
	res.admitted = last.Sub(start)
	if err := holdReleaseOrder(ctx, r, source, limit, &res.holdReleaseResult); err != nil {
		return res, err
	}
	if err := r.db.pool.QueryRow(ctx, `SELECT count(*) FROM workflow_events WHERE source = $1 AND status = 'exhausted'`, source).Scan(&res.exhausted); err != nil {
		return res, fmt.Errorf("count exhausted: %w", err)
	}
	stream, err := r.ojs.Stream(ctx, contract.StreamRetries)
	if err != nil {
		return res, fmt.Errorf("open RETRIES: %w", err)
	}
	info, err := stream.Info(ctx, jetstream.WithSubjectFilter(contract.RetryFilter(contract.KindEvent, contract.Due)))
	if err != nil {
		return res, fmt.Errorf("read RETRIES subjects: %w", err)
	}
	dues := 0
	for subj, c := range info.State.Subjects {
		if strings.HasPrefix(subj[strings.LastIndexByte(subj, '.')+1:], source+"-") {
			dues += int(c)
		}
	}
	res.duesPerEvent = float64(dues) / float64(n)
	waited, err := counterValue(reg, "retryd_ingress_retries_total", map[string]string{"source": source, "event": "waited"})
	if err != nil {
		return res, err
	}
	res.waitsPerEvent = waited / float64(n)
	return res, nil
}

// counterValue reads one counter of reg by name and labels (0 when the
// series does not exist yet).
func counterValue(reg prometheus.Gatherer, name string, labels map[string]string) (float64, error) {
	families, err := reg.Gather()
	if err != nil {
		return 0, fmt.Errorf("gather metrics: %w", err)
	}
	for _, f := range families {
		if f.GetName() != name {
			continue
		}
	series:
		for _, m := range f.GetMetric() {
			for _, lp := range m.GetLabel() {
				if v, ok := labels[lp.GetName()]; ok && v != lp.GetValue() {
					continue series
				}
			}
			return m.GetCounter().GetValue(), nil
		}
	}
	return 0, nil
}

// publishSeq publishes n events with sequence numbers to ingest.<source>,
// ids <source>-<seq>, and waits for their acks.
func publishSeq(ctx context.Context, r *retrydSys, source string, n int) error {
	for i := range n {
		id := fmt.Sprintf("%s-%07d", source, i)
		data, err := json.Marshal(map[string]any{"id": id, "source": source, "type": "bench.held", "data": map[string]int{"seq": i}})
		if err != nil {
			return err
		}
		msg := nats.NewMsg("ingest." + source)
		msg.Header.Set(nats.MsgIdHdr, id)
		msg.Data = data
		if err := r.pub.publish(ctx, msg, nil); err != nil {
			return fmt.Errorf("publish event %d: %w", i, err)
		}
	}
	if !r.pub.flush(ctx, 5*time.Minute) {
		return fmt.Errorf("publish %d events: acks outstanding after 5m", n)
	}
	if errs, err := r.pub.errors(); errs > 0 {
		return fmt.Errorf("publish events: %d failed, last: %w", errs, err)
	}
	return nil
}
