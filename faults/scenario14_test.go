package faults_test

import (
	"fmt"
	"math/rand/v2"
	"net/http"
	"slices"
	"strings"
	"testing"
	"time"

	"github.com/retryd/retryd/faults/harness"
	"github.com/retryd/retryd/pkg/contract"
)

// msgsPerRelease: what a held event moves on the streams once its source
// is resumed: ingress's releaser admits it at its slot (EVENTS) and
// closes its retry (succeeded); no due.
const msgsPerRelease = 2

// Scenario 14: a paused source holds a backlog of events; it is resumed
// with a rate limit the backlog does not fit in, and during the release
// the scheduler and ingress are each killed with kill -9 and restarted.
// Every held event is admitted exactly once, none is exhausted or spends
// a retry, no rate window admits more than the limit, no due is needed,
// and the release keeps the order the events arrived in (orderRules).
func TestScenario14KillDuringRelease(t *testing.T) {
	t.Parallel()
	const source = "s14"
	n := harness.Size(500, 5000)
	rounds := harness.Size(1, 2)
	s := setup(t, harness.Options{})
	r := &harness.Report{Scenario: "14 kill -9 scheduler, ingress during a release"}
	s.Start(harness.Scheduler)
	// One message at a time per consumer: the order the design promises is
	// the gate's order, which is arrival order only when the gate takes
	// the messages one by one (as TestE2EThrottledBurstIsAdmittedInOrderOneDueEach
	// runs it).
	s.Start(harness.Ingress, "RETRYD_INGRESS_CONCURRENCY=1")
	holdWithin := time.Duration(harness.Size(1, 3)) * time.Minute
	pace := s.Pace(r, assumeAll(r,
		requirement{"every event accepted and held (INGEST, held, scheduled)", 3 * n, holdWithin},
		requirement{"every event released and admitted", msgsPerRelease * n, scenarioTimeout()},
	))
	ingress := s.URL(harness.Ingress)
	limit := releaseLimit(t, s, r, n, pace)
	s.MustDo(http.MethodPut, ingress+"/v1/sources/"+source, map[string]any{"rate_limit": limit, "rate_window": "1s"}, http.StatusOK)
	s.MustDo(http.MethodPost, ingress+"/v1/sources/"+source+"/pause", map[string]any{"reason": "faults: scenario 14"}, http.StatusOK)

	events := make([]map[string]any, n)
	for i := range events {
		events[i] = map[string]any{"id": fmt.Sprintf("s14-ev-%06d", i), "source": source, "type": "order.created",
			"data": map[string]any{"n": i}}
	}
	sender := &harness.EventSender{Sys: s, URL: ingress}
	if err := sender.SendAll(s.Ctx, events, 8); err != nil {
		t.Fatalf("send events: %v", err)
	}
	// The release must find every event held by the scheduler: a hold
	// still on its way is released as it is applied, another path than
	// the one this scenario is about.
	var deferred, held int
	if _, ok := harness.Eventually(s.Ctx, bounded(holdWithin), 100*time.Millisecond, func() bool {
		_ = s.Pool.QueryRow(s.Ctx, `SELECT (SELECT count(*) FROM workflow_events WHERE source = $1 AND status = 'deferred'),
 (SELECT count(*) FROM retries WHERE kind = 'event' AND hold_key = $1 AND hold_reason = 'pause' AND state = 'scheduled')`,
			source).Scan(&deferred, &held)
		return deferred == n && held == n
	}); !ok {
		t.Fatalf("not every event held before the release: %d of %d deferred by ingress, %d held by the scheduler; %s",
			deferred, n, held, pace.Explain())
	}
	releaseOrder := heldOrder(t, s, source)
	arrival := arrivalOrder(t, s, source)

	s.MustDo(http.MethodPost, ingress+"/v1/sources/"+source+"/resume", nil, http.StatusOK)
	resumed := time.Now()
	r.Fault("resume %s with %d events held: %d per 1s window, about %s of slots", source, n, limit,
		(time.Duration(n) * time.Second / time.Duration(limit)).Round(time.Second))
	admitted := func() int {
		var c int
		_ = s.Pool.QueryRow(s.Ctx, `SELECT count(*) FROM workflow_events WHERE source = $1 AND status = 'admitted'`, source).Scan(&c)
		return c
	}

	// Each round kills the scheduler, then ingress, at points spread over
	// the release; the first kill comes at 5 % admitted, while the gate is
	// still handing out the release's slots.
	rng := rand.New(rand.NewPCG(uint64(time.Now().UnixNano()), 14))
	kills := 2 * rounds
	var last time.Time
	for k := range kills {
		victim := []string{harness.Scheduler, harness.Ingress}[k%2]
		at := n * (5 + 80*k/kills) / 100
		paced := time.Duration(at) * time.Second / time.Duration(limit)
		if _, ok := harness.Eventually(s.Ctx, bounded(time.Minute+paced+pace.For(msgsPerRelease*at)), 10*time.Millisecond, func() bool {
			return admitted() >= at
		}); !ok {
			t.Fatalf("release stalled before kill %d: %d of %d admitted %s after the resume, want %d; %s",
				k+1, admitted(), n, time.Since(resumed).Round(time.Millisecond), at, pace.Explain())
		}
		got := admitted()
		if got >= n {
			t.Fatalf("the release ended before kill %d could land inside it: %d of %d admitted %s after the resume",
				k+1, got, n, time.Since(resumed).Round(time.Millisecond))
		}
		if err := s.Service(victim).Kill9(); err != nil {
			t.Fatal(err)
		}
		down := time.Duration(100+rng.IntN(700)) * time.Millisecond
		r.Fault("kill -9 %s %s into the release (%d of %d admitted), down %s", victim,
			time.Since(resumed).Round(time.Millisecond), got, n, down)
		time.Sleep(down) // the outage itself
		s.Restart(victim)
		last = time.Now()
	}

	var counts map[string]int
	var rows int
	_, ok := harness.Eventually(s.Ctx, scenarioTimeout(), 200*time.Millisecond, func() bool {
		if rows = admitted(); rows < n {
			return false
		}
		stored, err := harness.Stored(s.Ctx, s.JS, contract.StreamEvents, "events."+source+".>")
		if err != nil {
			return false
		}
		counts = harness.CountByMsgID(stored)
		return len(counts) >= n && states(s.Ctx, s.Pool, contract.KindEvent)["succeeded"] >= n
	})
	r.Recover = time.Since(last)
	r.Note("release: %s from the resume to the last admission", time.Since(resumed).Round(time.Millisecond))

	accepted := sender.Accepted()
	r.Sent = len(accepted)
	for id := range accepted {
		if counts[id] == 0 {
			r.Lost++
		}
	}
	r.DuplicateEffects = harness.Duplicates(counts)
	dues, err := harness.Stored(s.Ctx, s.JS, contract.StreamRetries, contract.RetryFilter(contract.KindEvent, contract.Due))
	if err != nil {
		t.Fatalf("read dues: %v", err)
	}
	dueCounts := harness.CountByMsgID(dues)
	r.DuplicateEffects += harness.Duplicates(dueCounts)
	r.Absorbed = s.Wire.Extra(counts, func(id string) bool { return strings.HasPrefix(id, "s14-ev-") }) +
		s.Wire.Extra(dueCounts, func(id string) bool { return strings.HasPrefix(id, "event-retry:") })

	var exhausted, spent int
	_ = s.Pool.QueryRow(s.Ctx, `SELECT (SELECT count(*) FROM workflow_events WHERE source = $1 AND status = 'exhausted'),
 (SELECT count(*) FROM retries WHERE kind = 'event' AND (state = 'exhausted' OR retry_count > 0))`, source).Scan(&exhausted, &spent)
	var windows, fullest, counted int
	_ = s.Pool.QueryRow(s.Ctx, `SELECT count(*), coalesce(max(admitted), 0), coalesce(sum(admitted), 0)
 FROM event_source_windows WHERE source = $1`, source).Scan(&windows, &fullest, &counted)
	attempts := admittedAttempts(t, s, source)
	r.Note("events: %d accepted, %d admitted on EVENTS, %d admitted rows, %d exhausted; retry rows %v, %d exhausted or with a retry spent; %d dues stored",
		len(accepted), len(counts), rows, exhausted, states(s.Ctx, s.Pool, contract.KindEvent), spent, len(dues))
	r.Note("rate windows: %d, at most %d admitted in one (limit %d), %d admissions counted", windows, fullest, limit, counted)

	admissions, err := harness.Stored(s.Ctx, s.JS, contract.StreamEvents, "events."+source+".>")
	if err != nil {
		t.Fatalf("read admissions: %v", err)
	}
	admittedOrder := make([]string, 0, len(admissions))
	for _, m := range admissions {
		admittedOrder = append(admittedOrder, m.MsgID)
	}
	broken := orderRules(r, arrival, releaseOrder, admittedOrder, attempts)
	r.Print(t)
	if !ok || r.Lost != 0 || r.DuplicateEffects != 0 || len(accepted) != n {
		t.Fatalf("lost %d, duplicate effects %d, accepted %d of %d (all admitted: %v)%s", r.Lost, r.DuplicateEffects,
			len(accepted), n, ok, timedOut(ok, pace))
	}
	if exhausted != 0 || spent != 0 {
		t.Errorf("waiting is failing: %d events exhausted, %d retry rows exhausted or with a retry spent; want 0 and 0", exhausted, spent)
	}
	if float64(len(dues)) > 0.1*float64(n) {
		t.Errorf("the release went through dues: %d dues stored for %d released events; ingress admits a release line itself (want at most 0.1 per event)",
			len(dues), n)
	}
	if fullest > limit || counted != n {
		t.Errorf("release not paced by the rate limit: at most %d admitted in one window and %d admissions counted in windows; want at most %d and %d",
			fullest, counted, limit, n)
	}
	for _, b := range broken {
		t.Error(b)
	}
}

// orderRules checks the order the design promises for a release and
// returns a message per rule broken; it notes every figure in r. The
// promises (docs/ingress.md, Releases): the scheduler holds the events in
// the order they arrived; the resume puts them in ingress's release line
// in the order the gate deferred them (the arrival order, the gate taking
// one message at a time), and ingress's releaser admits the line a batch
// per transaction, in line order, at the limit. A batch commits whole or
// not at all, and the next instance takes the line up where it stands, so
// neither kill may reorder anything:
//
//   - held in arrival order: the scheduler's release order is the order
//     INGEST stored the events;
//   - admitted in release order: EVENTS stores the admissions in that
//     order, exactly;
//   - each admitted by the line: at the attempt the release completes (2),
//     not by a due or after being held again.
func orderRules(r *harness.Report, arrival, release, admitted []string, attempts map[string]int) []string {
	var broken []string
	held := orderStats(arrival, release)
	r.Note("first held against arrival (INGEST): %s", held)
	if held.outOfPlace != 0 || len(release) != len(arrival) {
		broken = append(broken, fmt.Sprintf("events not held in arrival order: %d of %d held events out of place (want 0)",
			held.outOfPlace, len(release)))
	}
	adm := orderStats(release, admitted)
	r.Note("admissions (EVENTS) against the release order: %s", adm)
	if adm.outOfPlace != 0 {
		broken = append(broken, fmt.Sprintf("admissions not in release order: %d of %d out of place, one at most %d places behind (want 0)",
			adm.outOfPlace, adm.n, adm.maxBehind))
	}
	r.Note("admitted by attempt: %s", attemptHistogram(attempts))
	other := 0
	for _, a := range attempts {
		if a != 2 {
			other++
		}
	}
	if other != 0 {
		broken = append(broken, fmt.Sprintf("%d events admitted at another attempt than the release's (2): held again or admitted by a due", other))
	}
	return broken
}

// heldOrder lists the events the scheduler holds under key in the order
// a release makes them due (retrystore.ReleaseHolds).
func heldOrder(t *testing.T, s *harness.System, key string) []string {
	t.Helper()
	rows, err := s.Pool.Query(s.Ctx, `SELECT item_id FROM retries WHERE kind = 'event' AND hold_key = $1
 ORDER BY held_since, created_at, item_id`, key)
	if err != nil {
		t.Fatalf("read held events: %v", err)
	}
	defer rows.Close()
	var out []string
	for rows.Next() {
		var id string
		if err := rows.Scan(&id); err != nil {
			t.Fatalf("read held events: %v", err)
		}
		out = append(out, id)
	}
	if err := rows.Err(); err != nil {
		t.Fatalf("read held events: %v", err)
	}
	return out
}

// arrivalOrder lists source's events in the order INGEST stored them.
func arrivalOrder(t *testing.T, s *harness.System, source string) []string {
	t.Helper()
	msgs, err := harness.Stored(s.Ctx, s.JS, contract.StreamIngest, "ingest."+source)
	if err != nil {
		t.Fatalf("read arrivals: %v", err)
	}
	out := make([]string, 0, len(msgs))
	for _, m := range msgs {
		out = append(out, m.MsgID)
	}
	return out
}

// admittedAttempts maps each admitted event of source to the attempt
// that admitted it: 2 is the release line's (the first deferral was 1);
// more means it was held again.
func admittedAttempts(t *testing.T, s *harness.System, source string) map[string]int {
	t.Helper()
	rows, err := s.Pool.Query(s.Ctx, `SELECT event_id, attempts FROM event_ingress_retries
 WHERE source = $1 AND retry_state = 'completed'`, source)
	if err != nil {
		t.Fatalf("read admitted attempts: %v", err)
	}
	defer rows.Close()
	out := map[string]int{}
	for rows.Next() {
		var id string
		var a int
		if err := rows.Scan(&id, &a); err != nil {
			t.Fatalf("read admitted attempts: %v", err)
		}
		out[id] = a
	}
	if err := rows.Err(); err != nil {
		t.Fatalf("read admitted attempts: %v", err)
	}
	return out
}

func attemptHistogram(attempts map[string]int) string {
	byAttempt := map[int]int{}
	for _, a := range attempts {
		byAttempt[a]++
	}
	keys := make([]int, 0, len(byAttempt))
	for a := range byAttempt {
		keys = append(keys, a)
	}
	slices.Sort(keys)
	parts := make([]string, 0, len(keys))
	for _, a := range keys {
		parts = append(parts, fmt.Sprintf("%d: %d", a, byAttempt[a]))
	}
	return strings.Join(parts, ", ")
}

// order is how far an observed order is from a reference one.
type order struct {
	n int
	// inversions counts the pairs observed in the opposite order.
	inversions int64
	// outOfPlace is the fewest items whose removal leaves the rest in
	// reference order (n minus the longest increasing subsequence).
	outOfPlace int
	// maxBehind is the most items ranked after one that went before it.
	maxBehind int
}

func (o order) String() string {
	return fmt.Sprintf("%d items, %d inverted pairs, %d out of place, at most %d places behind", o.n, o.inversions, o.outOfPlace, o.maxBehind)
}

// orderStats compares observed with ref; items missing from ref are
// ignored.
func orderStats(ref, observed []string) order {
	rank := make(map[string]int, len(ref))
	for i, id := range ref {
		rank[id] = i
	}
	seq := make([]int, 0, len(observed))
	for _, id := range observed {
		if k, ok := rank[id]; ok {
			seq = append(seq, k)
		}
	}
	o := order{n: len(seq)}
	// A Fenwick tree over the ranks seen so far counts, for each item, the
	// later-ranked items that went before it.
	tree := make([]int, len(ref)+1)
	for i, k := range seq {
		lower := 0
		for j := k + 1; j > 0; j -= j & -j {
			lower += tree[j]
		}
		o.inversions += int64(i - lower)
		o.maxBehind = max(o.maxBehind, i-lower)
		for j := k + 1; j <= len(ref); j += j & -j {
			tree[j]++
		}
	}
	var tails []int
	for _, k := range seq {
		if p, _ := slices.BinarySearch(tails, k); p == len(tails) {
			tails = append(tails, k)
		} else {
			tails[p] = k
		}
	}
	o.outOfPlace = len(seq) - len(tails)
	return o
}

// releaseLimit calibrates the source's rate limit on this machine: the
// release must be paced by the limit, not by how fast the machine admits,
// so that the kills land inside it and the release still runs at the
// limit. It times the gate on n/10 events of a source whose limit they
// never reach and takes a quarter of that rate (the releaser is faster
// than the gate, so this leaves room to spare). It caps the limit at n/10
// per second so the release lasts at least 10 s, for the kills to land
// inside it.
func releaseLimit(t *testing.T, s *harness.System, r *harness.Report, n int, pace harness.Pace) int {
	t.Helper()
	const source = "s14cal"
	ingress := s.URL(harness.Ingress)
	s.MustDo(http.MethodPut, ingress+"/v1/sources/"+source, map[string]any{"rate_limit": 1_000_000, "rate_window": "1s"}, http.StatusOK)
	events := make([]map[string]any, n/10)
	for i := range events {
		events[i] = map[string]any{"id": fmt.Sprintf("s14cal-ev-%06d", i), "source": source, "type": "order.created"}
	}
	start := time.Now()
	sender := &harness.EventSender{Sys: s, URL: ingress}
	if err := sender.SendAll(s.Ctx, events, 8); err != nil {
		t.Fatalf("send calibration events: %v", err)
	}
	var admitted int
	if _, ok := harness.Eventually(s.Ctx, bounded(time.Minute+pace.For(2*len(events))), 20*time.Millisecond, func() bool {
		_ = s.Pool.QueryRow(s.Ctx, `SELECT count(*) FROM workflow_events WHERE source = $1 AND status = 'admitted'`, source).Scan(&admitted)
		return admitted == len(events)
	}); !ok {
		t.Fatalf("calibration: %d of %d events admitted by a source without a limit in reach; %s", admitted, len(events), pace.Explain())
	}
	rate := float64(len(events)) / time.Since(start).Seconds()
	limit := min(n/10, int(rate/4))
	r.Note("gate, one message at a time: %.0f evaluations/s (calibration, %d events); rate limit derived from it: %d per 1s window",
		rate, len(events), limit)
	// A release over 5 minutes would leave the rest of the scenario no
	// time on a machine this slow.
	if least := max(2, n/300); limit < least {
		t.Fatalf("machine too slow for scenario 14: the gate evaluated %.0f events/s, so the release of %d events would need a limit of %d per second (under %d); %s",
			rate, n, limit, least, pace.Explain())
	}
	return limit
}
