package faults_test

import (
	"context"
	"flag"
	"fmt"
	"os"
	"strings"
	"testing"
	"time"

	"github.com/jackc/pgx/v5/pgxpool"

	"github.com/retryd/retryd/faults/harness"
	"github.com/retryd/retryd/migrations/pgtest"
	"github.com/retryd/retryd/pkg/contract"
)

// TestMain skips the whole suite with -short (make test-short): its
// scenarios start real processes and are most of make test's time. make
// test runs them at their short size, make faults at full size.
func TestMain(m *testing.M) {
	flag.Parse()
	if testing.Short() {
		fmt.Println("faults: fault scenarios skipped with -short; make test runs their short size, make faults their full size")
		os.Exit(0)
	}
	pgtest.Main(m)
}

// scenarioTimeout bounds one scenario.
func scenarioTimeout() time.Duration {
	if harness.Full() {
		return 30 * time.Minute
	}
	return 3 * time.Minute
}

// setup starts NATS and a fresh migrated database for one scenario; the
// scenario starts the services it needs.
func setup(t *testing.T, opts harness.Options) *harness.System {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), scenarioTimeout())
	t.Cleanup(cancel)
	if opts.DatabaseURL == "" {
		opts.DatabaseURL = pgtest.NewDatabaseURL(t)
	}
	return harness.NewSystem(t, ctx, opts)
}

// states counts the scheduler's retry rows of kind by state.
func states(ctx context.Context, pool *pgxpool.Pool, kind string) map[string]int {
	out := map[string]int{}
	rows, err := pool.Query(ctx, `SELECT state, count(*) FROM retries WHERE kind = $1 GROUP BY state`, kind)
	if err != nil {
		return out
	}
	defer rows.Close()
	for rows.Next() {
		var s string
		var n int
		if rows.Scan(&s, &n) == nil {
			out[s] = n
		}
	}
	return out
}

// fastPolicy is a policy without jitter whose first retry comes after
// delay.
func fastPolicy(name string, delay time.Duration, maxRetries int) map[string]any {
	return map[string]any{
		"name": name, "max_retries": maxRetries, "base_delay_ms": delay.Milliseconds(),
		"max_delay_ms": 4 * delay.Milliseconds(), "multiplier": 2, "jitter": "none",
	}
}

// ownPostgres starts a Postgres server of the scenario's own (one it
// stops, restarts or skews), env added to the server's environment, and
// creates database db in it unless db is "". It is removed with a fresh
// context: t.Context() is already cancelled when cleanups run.
func ownPostgres(t *testing.T, db string, env ...string) *harness.Postgres {
	t.Helper()
	pg, err := harness.NewPostgres(t.Context(), "")
	if err != nil {
		harness.Missing(t, "the Postgres 15 server binaries", err, "apt-get install postgresql-15")
	}
	pg.Env = env
	t.Cleanup(func() { pg.Remove(context.Background()) })
	if err := pg.Start(t.Context()); err != nil {
		t.Fatal(err)
	}
	if db != "" {
		if err := pg.CreateDatabase(t.Context(), db); err != nil {
			t.Fatal(err)
		}
	}
	return pg
}

// spreadLoad sends events to the ingress over HTTP and publishes msgs in
// slices of slice, both paced to span span, so that the faults a
// scenario injects meanwhile land in the middle of the load. wait fails
// the test on the first error of either.
func spreadLoad(s *harness.System, span time.Duration, events []map[string]any, msgs []*natsMsg, slice int) (sender *harness.EventSender, wait func(t *testing.T)) {
	sender = &harness.EventSender{Sys: s, URL: s.URL(harness.Ingress), Every: span / time.Duration(len(events))}
	sendDone := make(chan error, 1)
	go func() { sendDone <- sender.SendAll(s.Ctx, events, 8) }()
	pubDone := make(chan error, 1)
	go func() {
		for i := 0; i < len(msgs); i += slice {
			time.Sleep(span / time.Duration(len(msgs)/slice))
			if _, err := harness.PublishAll(s.Ctx, s.JS, msgs[i:min(i+slice, len(msgs))]); err != nil {
				pubDone <- err
				return
			}
		}
		pubDone <- nil
	}()
	return sender, func(t *testing.T) {
		t.Helper()
		if err := <-sendDone; err != nil {
			t.Fatalf("send events: %v", err)
		}
		if err := <-pubDone; err != nil {
			t.Fatalf("publish failures: %v", err)
		}
	}
}

// eventCheck adds to r the events sender got accepted: those counts
// (admissions per event id) lacks are lost, those admitted more than once
// duplicate effects. It returns how many were accepted and lost.
func eventCheck(r *harness.Report, sender *harness.EventSender, counts map[string]int) (accepted, lost int) {
	ids := sender.Accepted()
	for id := range ids {
		if counts[id] == 0 {
			lost++
		}
	}
	r.Sent += len(ids)
	r.Lost += lost
	r.DuplicateEffects += harness.Duplicates(counts)
	return len(ids), lost
}

// failedItems builds the first failure of n items of kind.
func failedItems(t *testing.T, kind, prefix string, n int, retryAfter func(i int) *contract.RetryAfter) ([]string, []*natsMsg) {
	t.Helper()
	ids := make([]string, n)
	msgs := make([]*natsMsg, n)
	for i := range n {
		ids[i] = fmt.Sprintf("%s-%06d", prefix, i)
		var ra *contract.RetryAfter
		if retryAfter != nil {
			ra = retryAfter(i)
		}
		m, err := harness.FailedMsg(kind, ids[i], 1, "temporary", ra)
		if err != nil {
			t.Fatalf("build failed event: %v", err)
		}
		msgs[i] = m
	}
	return ids, msgs
}

// dueCheck reads every stored due of kind and compares with the items
// sent: lost are items whose due for attempt 2 never arrived at the
// owner, duplicate effects are dues stored more than once, absorbed the
// due copies deduplication dropped plus the redeliveries the owner saw.
func dueCheck(t *testing.T, s *harness.System, o *harness.Owner, kind string, ids []string, r *harness.Report) {
	t.Helper()
	stored, err := harness.Stored(s.Ctx, s.JS, contract.StreamRetries, contract.RetryFilter(kind, contract.Due))
	if err != nil {
		t.Fatalf("read dues: %v", err)
	}
	counts := harness.CountByMsgID(stored)
	r.Sent = len(ids)
	for _, id := range ids {
		if !o.Has(id, 2) {
			r.Lost++
		}
	}
	ownerDups, redeliveries := o.Tally()
	r.DuplicateEffects = max(harness.Duplicates(counts), ownerDups)
	r.Absorbed = s.Wire.Extra(counts, func(id string) bool { return strings.HasPrefix(id, kind+"-retry:") }) + redeliveries
	r.Note("dues stored %d for %d items; owner redeliveries %d", len(stored), len(ids), redeliveries)
}
