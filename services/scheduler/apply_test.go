package scheduler

import (
	"context"
	"strings"
	"testing"
	"time"

	"github.com/jackc/pgx/v5/pgxpool"
	"github.com/nats-io/nats.go/jetstream"
	"github.com/stretchr/testify/require"

	"github.com/retryd/retryd/pkg/contract"
	"github.com/retryd/retryd/stores/retrystore"
)

func TestAcceptsFailure(t *testing.T) {
	t.Parallel()
	row := func(state retrystore.State, attempt int) *retrystore.Retry {
		return &retrystore.Retry{State: state, Attempt: attempt}
	}
	cases := []struct {
		name    string
		row     *retrystore.Retry
		attempt int
		want    bool
	}{
		{"new item", nil, 1, true},
		{"new item reported late", nil, 3, true},
		{"due attempt failed", row(retrystore.StateDue, 2), 2, true},
		{"old attempt", row(retrystore.StateDue, 3), 2, false},
		{"future attempt", row(retrystore.StateScheduled, 2), 5, false},
		{"cancelled", row(retrystore.StateCancelled, 2), 2, false},
		{"exhausted", row(retrystore.StateExhausted, 2), 2, false},
		{"succeeded", row(retrystore.StateSucceeded, 2), 2, false},
	}
	for _, c := range cases {
		require.Equal(t, c.want, acceptsFailure(c.row, c.attempt), c.name)
	}
}

func TestManualRetryBudget(t *testing.T) {
	t.Parallel()
	now := time.Date(2030, 1, 1, 0, 0, 0, 0, time.UTC)
	cases := []struct {
		name                  string
		state                 retrystore.State
		attempt, base         int
		reset                 bool
		wantAttempt, wantBase int
		wantRetryCount        int
		wantNoteContains      string
	}{
		{"exhausted keeps its used budget", retrystore.StateExhausted, 4, 0, false, 5, 0, 4, "manual retry by ops"},
		{"exhausted with reset", retrystore.StateExhausted, 4, 0, true, 5, 4, 0, "attempts reset"},
		{"waiting retry is replaced for free", retrystore.StateScheduled, 3, 0, false, 4, 1, 2, "manual"},
		{"due attempt counts", retrystore.StateDue, 3, 0, false, 4, 0, 3, "manual"},
		{"after an earlier reset", retrystore.StateCancelled, 7, 4, false, 8, 4, 3, "manual"},
	}
	for _, c := range cases {
		r := retrystore.Retry{Kind: "job", ItemID: "j", State: c.state, Attempt: c.attempt, BudgetBase: c.base,
			PolicyName: "p", PolicyVersion: 2, MaxRetries: 3, LastErrorClass: "timeout"}
		ch, err := manualRetry(r, RetryNowOptions{By: "ops", ResetAttempts: c.reset, Reason: "why"}, now)
		require.NoError(t, err, c.name)
		require.Equal(t, retrystore.StateScheduled, ch.row.State, c.name)
		require.Equal(t, c.wantAttempt, ch.row.Attempt, c.name)
		require.Equal(t, c.wantBase, ch.row.BudgetBase, c.name)
		require.Equal(t, c.wantRetryCount, ch.row.RetryCount, c.name)
		require.Equal(t, c.wantAttempt-1-c.wantBase, ch.row.RetryCount, "%s: retry_count = attempt-1-budget_base", c.name)
		require.True(t, now.Equal(*ch.row.NextAttemptAt), c.name)
		require.Len(t, ch.msgs, 1)
		require.Equal(t, contract.LifecycleMsgID("job", contract.Rescheduled, "j", c.wantAttempt), ch.msgs[0].Header.Get(contract.HeaderMsgID))
		require.Contains(t, string(ch.history[0].Detail), c.wantNoteContains, c.name)
		require.Equal(t, contract.DecidedByManual, ch.history[0].DecidedBy)

		// Replaying the event gives the same row.
		ev, err := contract.DecodeLifecycle(ch.msgs[0].Subject, ch.msgs[0].Data)
		require.NoError(t, err)
		replayed := replayScheduled(&r, newFact(ev, ch.msgs[0].Header.Get(contract.HeaderMsgID)))
		require.Equal(t, *ch.row, *replayed.row, c.name)
		require.Equal(t, ch.history, replayed.history, c.name)
	}
}

// A due that overtook its decision in the stream ends in the same row as
// the decision followed by the due.
func TestReplayDueBeforeDecision(t *testing.T) {
	t.Parallel()
	failedAt := time.Date(2030, 1, 1, 0, 0, 0, 0, time.UTC)
	next := failedAt.Add(time.Second)
	fd := &contract.FailedData{Kind: "event", ID: "e", Attempt: 1, Error: contract.ErrorInfo{Class: "timeout", Message: "m"},
		Payload: []byte(`{"a":1}`)}
	f := fact{ev: contract.LifecycleEvent{Kind: "event", ID: "e", Event: contract.Failed, Failed: fd}, msgID: "f1", at: failedAt}
	awaiting, _ := recordFailure(nil, f, "timeout")
	require.True(t, awaitingDecision(&awaiting))

	sd := &contract.ScheduledData{Kind: "event", ID: "e", Attempt: 2, NextAttemptAt: next,
		Decision: contract.Decision{Policy: "p", PolicyVersion: 1, DecidedBy: "backoff", ErrorClass: "timeout", RetryCount: 1, MaxRetries: 3, DelayMS: 1000}}
	dd := &contract.DueData{Kind: "event", ID: "e", Attempt: 2, NextAttemptAt: next, Payload: []byte(`{"a":1}`)}
	sched := fact{ev: contract.LifecycleEvent{Kind: "event", ID: "e", Event: contract.Scheduled, Scheduled: sd}, msgID: "s", at: failedAt}
	due := fact{ev: contract.LifecycleEvent{Kind: "event", ID: "e", Event: contract.Due, Due: dd}, msgID: "d", at: next}

	inOrder := replayScheduled(&awaiting, sched)
	inOrder = replayDue(inOrder.row, due)
	overtaken := replayDue(&awaiting, due)
	overtaken = replayScheduled(overtaken.row, sched)
	require.Equal(t, *inOrder.row, *overtaken.row)
	require.Equal(t, retrystore.StateDue, inOrder.row.State)
	require.Equal(t, 1, inOrder.row.DueEmissions)
	require.Equal(t, 1, inOrder.row.RetryCount)

	// The owner's answer to the due may overtake the decision too: the
	// decision read late ends in the same row as read in order.
	closed := fact{ev: contract.LifecycleEvent{Kind: "event", ID: "e", Event: contract.Succeeded,
		Succeeded: &contract.SucceededData{Kind: "event", ID: "e", Attempt: 2}}, msgID: "ok", at: next.Add(time.Millisecond)}
	inOrderClosed := applySucceeded(inOrder.row, closed)
	lateClosed := applySucceeded(replayDue(&awaiting, due).row, closed)
	require.True(t, replayScheduled(lateClosed.row, sched).stale, "without the rebuilder's note of the overtaking due")
	late := replayLateDecision(lateClosed.row, sched)
	require.Equal(t, *inOrderClosed.row, *late.row)
	require.Equal(t, 1, late.row.RetryCount)
	require.Equal(t, contract.Scheduled, late.outcome)

	// The same due again is a re-emission; an older one is stale.
	again := replayDue(inOrder.row, due)
	require.Equal(t, 2, again.row.DueEmissions)
	old := replayDue(again.row, fact{ev: contract.LifecycleEvent{Kind: "event", ID: "e", Event: contract.Due,
		Due: &contract.DueData{Kind: "event", ID: "e", Attempt: 1}}})
	require.True(t, old.stale)
}

func TestConfigValidateNamesFields(t *testing.T) {
	t.Parallel()
	// pgxpool connects lazily: no server is needed to build one.
	pool, err := pgxpool.New(context.Background(), "postgres://127.0.0.1:1/none")
	require.NoError(t, err)
	t.Cleanup(pool.Close)
	var js jetstream.JetStream = fakeJS{}
	cases := []struct {
		mod   func(*Config)
		field string
	}{
		{func(c *Config) { c.Pool = nil }, "Config.Pool"},
		{func(c *Config) { c.JS = nil }, "Config.JS"},
		{func(c *Config) { c.RedueAfter = 2 * time.Minute }, "Config.RedueAfter"},
		{func(c *Config) { c.BatchSize = -1 }, "Config.BatchSize"},
		{func(c *Config) { c.ConsumeBatch = 20_000 }, "Config.ConsumeBatch"},
		{func(c *Config) { c.AckWait = 10 * time.Millisecond }, "Config.AckWait"},
		{func(c *Config) { c.MaxIdle = time.Microsecond }, "Config.MaxIdle"},
		{func(c *Config) { c.Streams.Replicas = 9 }, "Config.Streams"},
		{func(c *Config) { c.InboxRetention = time.Minute }, "Config.InboxRetention"},
	}
	for _, c := range cases {
		cfg := Config{Pool: pool, JS: js}
		c.mod(&cfg)
		err := cfg.validate()
		require.Error(t, err, c.field)
		require.True(t, strings.Contains(err.Error(), c.field), err.Error())
	}
	cfg := Config{Pool: pool, JS: js}
	require.NoError(t, cfg.validate())
	require.Equal(t, DefaultBatchSize, cfg.BatchSize)
	require.Equal(t, DefaultRedueAfter, cfg.RedueAfter)
	require.Equal(t, DefaultMaxIdle, cfg.MaxIdle)
	require.NotNil(t, cfg.Classifier)
	require.NotNil(t, cfg.Registerer)
	require.NotEmpty(t, cfg.Instance)
}

// fakeJS only stands in for a JetStream handle in validation.
type fakeJS struct{ jetstream.JetStream }
