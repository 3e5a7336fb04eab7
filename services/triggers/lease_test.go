package triggers

import (
	"net/http"
	"testing"
	"time"

	"github.com/nats-io/nats.go"
	"github.com/stretchr/testify/require"

	"github.com/retryd/retryd/pkg/contract"
	"github.com/retryd/retryd/services/triggers/internal/triggerstore"
	"github.com/retryd/retryd/stores/pgdb"
)

// publishHeartbeat publishes a heartbeat for a run, as an executor would.
func (b *bundle) publishHeartbeat(t *testing.T, workflow, runID string) *nats.Msg {
	t.Helper()
	msg, err := contract.NewRunMsg("test/executor", contract.RunHeartbeat, contract.RunHeartbeatData{RunID: runID, Workflow: workflow}, time.Now())
	require.NoError(t, err)
	_, err = b.js.PublishMsg(b.ctx, msg)
	require.NoError(t, err)
	return msg
}

func (b *bundle) run(t *testing.T, id string) triggerstore.Run {
	t.Helper()
	r, err := triggerstore.GetRun(b.ctx, b.pool, id)
	require.NoError(t, err)
	return r
}

// leaseFor is how long past its request a run's lease runs now.
func leaseFor(t *testing.T, r triggerstore.Run) time.Duration {
	t.Helper()
	require.NotNil(t, r.LeaseExpiresAt, "run %s has a lease", r.ID)
	return r.LeaseExpiresAt.Sub(r.RequestedAt)
}

// A trigger's run_timeout is shown and versioned with its definition, a
// PUT that leaves it out goes back to the service's default, and the
// column is NULL then.
func TestTriggerAPIRunTimeout(t *testing.T) {
	t.Parallel()
	b := setup(t, false)
	in := TriggerInput{ID: "lease", Name: "x", Source: "billing", EventType: "invoice.paid", Workflow: "w", RunTimeout: "30m"}
	v := b.createTrigger(t, in)
	require.Equal(t, "30m0s", v.RunTimeout)
	require.Equal(t, int64(30*60*1000), v.RunTimeoutMS)

	var got TriggerView
	require.Equal(t, http.StatusOK, b.do(t, http.MethodGet, "/v1/triggers/lease", nil, &got))
	require.Equal(t, "30m0s", got.RunTimeout)

	in.RunTimeout = ""
	require.Equal(t, http.StatusOK, b.do(t, http.MethodPut, "/v1/triggers/lease", in, &got))
	require.Equal(t, 2, got.Version, "dropping the run timeout is a change")
	require.Empty(t, got.RunTimeout, "the service's default")
	require.Zero(t, got.RunTimeoutMS)
	var col *int64
	require.NoError(t, b.pool.QueryRow(b.ctx, `SELECT run_timeout_ms FROM workflow_triggers WHERE trigger_id = 'lease'`).Scan(&col))
	require.Nil(t, col, "no run timeout of its own is NULL")

	in.RunTimeout = "2h"
	require.Equal(t, http.StatusOK, b.do(t, http.MethodPut, "/v1/triggers/lease", in, &got))
	require.Equal(t, 3, got.Version)
	require.Equal(t, "2h0m0s", got.RunTimeout)
	require.Equal(t, http.StatusOK, b.do(t, http.MethodPut, "/v1/triggers/lease", in, &got))
	require.Equal(t, 3, got.Version, "the same run timeout again is no change")

	var e apiError
	in.RunTimeout = "0s"
	require.Equal(t, http.StatusBadRequest, b.do(t, http.MethodPut, "/v1/triggers/lease", in, &e))
	require.Equal(t, "run_timeout", e.Error.Field)
	require.Contains(t, e.Error.Message, "between 1s and 168h0m0s")

	var versions struct {
		Versions []VersionView `json:"versions"`
	}
	require.Equal(t, http.StatusOK, b.do(t, http.MethodGet, "/v1/triggers/lease/versions", nil, &versions))
	require.Len(t, versions.Versions, 3)
	require.Equal(t, []string{"30m0s", "", "2h0m0s"},
		[]string{versions.Versions[0].RunTimeout, versions.Versions[1].RunTimeout, versions.Versions[2].RunTimeout})
}

// A trigger's own run timeout wins over the service's default, both ways:
// the run of a trigger without one expires at the default, the run of a
// trigger with a longer one keeps its slot, and a shorter one expires
// before the default would.
func TestRunTimeoutPerTriggerOverridesTheDefault(t *testing.T) {
	t.Parallel()
	b := setup(t, true, func(c *Config) { c.RunTimeout = 2 * time.Second })
	dflt := b.createTrigger(t, TriggerInput{ID: "dflt", Name: "dflt", Source: "crm", EventType: "lead.created",
		MaxConcurrency: new(1), Workflow: "enrich"})
	long := b.createTrigger(t, TriggerInput{ID: "long", Name: "long", Source: "crm", EventType: "lead.created",
		MaxConcurrency: new(1), Workflow: "enrich", RunTimeout: "1h"})
	short := b.createTrigger(t, TriggerInput{ID: "short", Name: "short", Source: "crm", EventType: "lead.created",
		MaxConcurrency: new(1), Workflow: "enrich", RunTimeout: "1s"})
	b.publishEvent(t, "crm", "lead.created", "lead-0", map[string]any{})
	runs := map[string]string{}
	for _, tr := range []TriggerView{dflt, long, short} {
		d := b.waitDelivery(t, DeliveryID("lead-0", tr.ID), func(d triggerstore.Delivery) bool { return d.Status == triggerstore.StatusLaunched })
		runs[tr.ID] = d.RunID
	}
	require.Equal(t, 2*time.Second, leaseFor(t, b.run(t, runs["dflt"])), "the service's default")
	require.Equal(t, time.Hour, leaseFor(t, b.run(t, runs["long"])), "the trigger's own")
	require.Equal(t, time.Second, leaseFor(t, b.run(t, runs["short"])), "the trigger's own")

	// The lease loop is off in tests: expire by hand once every lease
	// but the long one has ended.
	require.Eventually(t, func() bool {
		now, err := triggerstore.Now(b.ctx, b.pool)
		return err == nil && now.After(b.run(t, runs["dflt"]).LeaseExpiresAt.Add(10*time.Millisecond))
	}, eventually, tick)
	n, err := b.svc.ExpireRuns(b.ctx)
	require.NoError(t, err)
	require.Equal(t, 2, n)
	for id, status := range map[string]triggerstore.RunStatus{"dflt": triggerstore.RunRetrying, "short": triggerstore.RunRetrying, "long": triggerstore.RunRequested} {
		r := b.run(t, runs[id])
		require.Equal(t, status, r.Status, id)
		if status == triggerstore.RunRetrying {
			require.Equal(t, triggerstore.RunTimeoutReason, r.Error, id)
			require.Equal(t, 1.0, counter(t, b.svc.metrics.runsFailed, id, "timeout"), id)
			findLifecycleOf(t, b, contract.KindRun, contract.Failed, r.ID, 1)
		}
	}
	require.Equal(t, 1, b.inFlight(t, long.ID), "the long run keeps its slot past the service's default")
}

// Heartbeats keep a run's slot past its original timeout; once they stop,
// the attempt expires as run_timeout (on the run and its delivery), and
// once the scheduler gives up on the run (no retry, here) the delivery
// that waited longest launches, the newer one still waits.
func TestHeartbeatKeepsTheLeaseUntilItStops(t *testing.T) {
	t.Parallel()
	b := setup(t, true, func(c *Config) { c.LeaseInterval = 100 * time.Millisecond })
	b.startScheduler(t)
	// Only a freed slot may launch a waiting delivery, not its backoff.
	b.slowDeliveryBackoff(t)
	b.noRunRetries(t)
	const timeout = 2 * time.Second
	tr := b.createTrigger(t, TriggerInput{ID: "beat", Name: "beat", Source: "crm", EventType: "lead.created",
		MaxConcurrency: new(1), Workflow: "enrich", RunTimeout: timeout.String()})
	first, second, third := DeliveryID("beat-0", tr.ID), DeliveryID("beat-1", tr.ID), DeliveryID("beat-2", tr.ID)
	b.publishEvent(t, "crm", "lead.created", "beat-0", map[string]any{})
	d0 := b.waitDelivery(t, first, func(d triggerstore.Delivery) bool { return d.Status == triggerstore.StatusLaunched })
	for i, id := range []string{second, third} {
		b.publishEvent(t, "crm", "lead.created", []string{"beat-1", "beat-2"}[i], map[string]any{})
		b.waitDelivery(t, id, func(d triggerstore.Delivery) bool { return d.Status == triggerstore.StatusConcurrencyLimited })
	}

	// Beat for twice the timeout: the run keeps its slot all along.
	requested := b.run(t, d0.RunID).RequestedAt
	for time.Since(requested) < 2*timeout {
		b.publishHeartbeat(t, "enrich", d0.RunID)
		time.Sleep(250 * time.Millisecond)
		require.Equal(t, triggerstore.RunRequested, b.run(t, d0.RunID).Status, "a run that beats keeps its lease")
	}
	b.settled(t, contract.StreamRuns, ConsumerRuns)
	r := b.run(t, d0.RunID)
	require.Equal(t, triggerstore.RunRequested, r.Status)
	require.Greater(t, leaseFor(t, r), 2*timeout-250*time.Millisecond, "heartbeats moved the lease past the original timeout")
	require.Equal(t, triggerstore.StatusConcurrencyLimited, b.delivery(t, second).Status)
	require.Positive(t, counter(t, b.svc.metrics.heartbeats, heartbeatExtended))
	lastLease := *r.LeaseExpiresAt

	// The executor goes silent: the lease ends, the run is failed as
	// run_timeout and the oldest waiting delivery takes the slot.
	b.waitDelivery(t, second, func(d triggerstore.Delivery) bool { return d.Status == triggerstore.StatusLaunched })
	r = b.run(t, d0.RunID)
	require.Equal(t, triggerstore.RunFailedMaxRetries, r.Status)
	require.Equal(t, "timeout", r.LastErrorClass)
	require.False(t, r.FinishedAt.Before(lastLease), "not before the last lease ended")
	require.Equal(t, triggerstore.RunTimeoutReason, b.delivery(t, first).StatusReason)
	require.Equal(t, 1.0, counter(t, b.svc.metrics.runsFailed, tr.ID, "timeout"))
	require.Equal(t, triggerstore.StatusConcurrencyLimited, b.delivery(t, third).Status, "oldest first: the newer delivery still waits")
}

// A heartbeat for a run that finished, or that retryd never launched, is
// acked, counted as ignored and changes nothing; the same heartbeat
// stored twice is harmless; a malformed one is terminated and counted.
func TestHeartbeatsThatChangeNothing(t *testing.T) {
	t.Parallel()
	b := setup(t, true)
	tr := b.createTrigger(t, TriggerInput{ID: "done", Name: "done", Source: "crm", EventType: "lead.created",
		MaxConcurrency: new(1), Workflow: "enrich"})
	b.publishEvent(t, "crm", "lead.created", "done-0", map[string]any{})
	d0 := b.waitDelivery(t, DeliveryID("done-0", tr.ID), func(d triggerstore.Delivery) bool { return d.Status == triggerstore.StatusLaunched })
	b.publishEvent(t, "crm", "lead.created", "done-1", map[string]any{})
	d1 := b.waitDelivery(t, DeliveryID("done-1", tr.ID), func(d triggerstore.Delivery) bool { return d.Status == triggerstore.StatusConcurrencyLimited })

	// A duplicated heartbeat: stored once (same Nats-Msg-Id) and then
	// twice (a redelivery the duplicate window cannot catch).
	hb := b.publishHeartbeat(t, "enrich", d0.RunID)
	_, err := b.js.PublishMsg(b.ctx, hb)
	require.NoError(t, err)
	b.republish(t, hb)
	// The consumer's pending count can lag a publish by a moment: wait
	// for the two stored heartbeats, then for the consumer to be idle.
	require.Eventually(t, func() bool { return counter(t, b.svc.metrics.heartbeats, heartbeatExtended) >= 2 }, eventually, tick)
	b.settled(t, contract.StreamRuns, ConsumerRuns)
	require.Equal(t, 2.0, counter(t, b.svc.metrics.heartbeats, heartbeatExtended), "the duplicate window dropped one")
	r := b.run(t, d0.RunID)
	require.Equal(t, triggerstore.RunRequested, r.Status)
	lease := *r.LeaseExpiresAt
	require.Equal(t, 1, b.inFlight(t, tr.ID))
	require.Equal(t, triggerstore.StatusConcurrencyLimited, b.delivery(t, d1.ID).Status, "a heartbeat frees no slot")
	require.Zero(t, counter(t, b.svc.metrics.duplicates, ConsumerRuns))

	// A heartbeat from long ago (a replay) never moves a lease backwards.
	r, extended, err := triggerstore.ExtendLease(b.ctx, b.pool, d0.RunID, time.Now().Add(-time.Hour), time.Second)
	require.NoError(t, err)
	require.True(t, extended)
	require.True(t, r.LeaseExpiresAt.Equal(lease), "lease %s, was %s", r.LeaseExpiresAt, lease)

	b.publishRunFinished(t, "enrich", d0.RunID, contract.RunCompleted)
	// Waited for by its effect: the consumer's pending count can lag the
	// publish (CI run Y found the consumer "idle" and the run still
	// requested).
	require.Eventually(t, func() bool { return b.run(t, d0.RunID).Status == triggerstore.RunCompleted }, eventually, tick)
	b.settled(t, contract.StreamRuns, ConsumerRuns)
	finished := b.run(t, d0.RunID)

	// After the end, and for a run nobody launched: ignored.
	b.publishHeartbeat(t, "enrich", d0.RunID)
	b.publishHeartbeat(t, "enrich", "run-nobody-launched")
	require.Eventually(t, func() bool { return counter(t, b.svc.metrics.heartbeats, heartbeatIgnored) >= 2 }, eventually, tick)
	b.settled(t, contract.StreamRuns, ConsumerRuns)
	require.Equal(t, 2.0, counter(t, b.svc.metrics.heartbeats, heartbeatIgnored))
	after := b.run(t, d0.RunID)
	require.Equal(t, finished, after, "a heartbeat for a finished run changes nothing")
	_, err = triggerstore.GetRun(b.ctx, b.pool, "run-nobody-launched")
	require.ErrorIs(t, err, pgdb.ErrNotFound)

	// Malformed heartbeats: not JSON, an unknown field, a run id that
	// differs from the subject's.
	for subject, body := range map[string]string{
		"runs.enrich.heartbeat.r1": `not json`,
		"runs.enrich.heartbeat.r2": `{"specversion":"1.0","id":"x","source":"s","type":"run.heartbeat","time":"2026-01-01T00:00:00Z","data":{"run_id":"r2","workflow":"enrich","lease":"1h"}}`,
		"runs.enrich.heartbeat.r3": `{"specversion":"1.0","id":"y","source":"s","type":"run.heartbeat","time":"2026-01-01T00:00:00Z","data":{"run_id":"r4","workflow":"enrich"}}`,
	} {
		_, err := b.js.Publish(b.ctx, subject, []byte(body))
		require.NoError(t, err)
	}
	require.Eventually(t, func() bool { return counter(t, b.svc.metrics.malformed, ConsumerRuns) == 3 }, eventually, tick)
	b.settled(t, contract.StreamRuns, ConsumerRuns)
	require.Equal(t, 2.0, counter(t, b.svc.metrics.heartbeats, heartbeatIgnored), "malformed heartbeats are not counted as ignored")
}
