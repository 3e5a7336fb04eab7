package scheduler_test

import (
	"strconv"
	"testing"
	"time"

	"github.com/stretchr/testify/require"

	"github.com/retryd/retryd/pkg/contract"
	"github.com/retryd/retryd/stores/retrystore"
)

// A job's overrides, as its failed or held event carries them, come back
// as fields of its due: the job that runs again has them, with no round
// trip through metadata.
func TestDueCarriesTheJobsOverrides(t *testing.T) {
	t.Parallel()
	b := setup(t)
	b.policy(t, contract.KindJob, "", 3, 10, 10)
	b.start(t)

	maxRetries, enabled := 7, true
	fd := failed(contract.KindJob, "ov-1", 1, "timeout")
	fd.JobType, fd.MaxRetries, fd.RetryEnabled, fd.TimeoutMS = "send", &maxRetries, &enabled, 60_000
	fd.Metadata = map[string]string{"tenant": "t1"}
	b.publish(t, contract.Failed, fd)
	row := b.waitRow(t, contract.KindJob, "ov-1", inState(retrystore.StateDue, 2))
	require.EqualValues(t, 60_000, *row.TimeoutMS)

	dues := b.streamMsgs(t, contract.RetryFilter(contract.KindJob, contract.Due))
	require.Len(t, dues, 1)
	d := decodeDue(t, dues[0])
	require.Equal(t, 7, *d.MaxRetries)
	require.Nil(t, d.RetryEnabled, "left out while retries are enabled (the default)")
	require.EqualValues(t, 60_000, d.TimeoutMS)
	require.Equal(t, map[string]string{"tenant": "t1"}, d.Metadata)

	// A hold keeps them the same way.
	until := time.Now().Add(50 * time.Millisecond).UTC()
	b.publish(t, contract.Held, contract.HeldData{Kind: contract.KindJob, ID: "ov-2", Attempt: 1, Reason: contract.HoldThrottle,
		Until: &until, JobType: "send", MaxRetries: &maxRetries, TimeoutMS: 1500})
	b.waitRow(t, contract.KindJob, "ov-2", inState(retrystore.StateDue, 2))
	for _, m := range b.streamMsgs(t, contract.RetryFilter(contract.KindJob, contract.Due)) {
		if d := decodeDue(t, m); d.ID == "ov-2" {
			require.Equal(t, 7, *d.MaxRetries)
			require.EqualValues(t, 1500, d.TimeoutMS)
			return
		}
	}
	t.Fatal("no due for the held job")
}

// A job's priority band, as its failed or held event carries it, comes
// back on its due, so the worker routes the retry to the job's band; a
// fact without one leaves the band the row has.
func TestDueCarriesTheJobsPriority(t *testing.T) {
	t.Parallel()
	b := setup(t)
	b.policy(t, contract.KindJob, "", 3, 10, 10)
	b.start(t)

	fd := failed(contract.KindJob, "prio-1", 1, "network")
	fd.JobType, fd.Priority = "send", contract.PriorityHigh
	b.publish(t, contract.Failed, fd)
	row := b.waitRow(t, contract.KindJob, "prio-1", inState(retrystore.StateDue, 2))
	require.Equal(t, "high", row.Priority)
	// The second failure comes from an owner that does not send a
	// priority: the job keeps its band.
	fd2 := failed(contract.KindJob, "prio-1", 2, "network")
	fd2.JobType = "send"
	b.publish(t, contract.Failed, fd2)
	row = b.waitRow(t, contract.KindJob, "prio-1", inState(retrystore.StateDue, 3))
	require.Equal(t, "high", row.Priority)

	until := time.Now().Add(50 * time.Millisecond).UTC()
	b.publish(t, contract.Held, contract.HeldData{Kind: contract.KindJob, ID: "prio-2", Attempt: 1, Reason: contract.HoldThrottle,
		Until: &until, JobType: "send", Priority: contract.PriorityLow})
	b.waitRow(t, contract.KindJob, "prio-2", inState(retrystore.StateDue, 2))

	got := map[string]contract.Priority{}
	for _, m := range b.streamMsgs(t, contract.RetryFilter(contract.KindJob, contract.Due)) {
		d := decodeDue(t, m)
		got[d.ID+":"+strconv.Itoa(d.Attempt)] = d.Priority
	}
	require.Equal(t, map[string]contract.Priority{"prio-1:2": contract.PriorityHigh, "prio-1:3": contract.PriorityHigh, "prio-2:2": contract.PriorityLow}, got)
}
