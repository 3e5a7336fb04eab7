package contract_test

import (
	"strings"
	"testing"
	"time"

	"github.com/nats-io/nats.go"
	"github.com/stretchr/testify/require"

	"github.com/retryd/retryd/pkg/contract"
)

// A periodic schedule's tick is named by its sequence in JOBS; a delayed
// job and a job no schedule fired keep their id; a tick whose id would
// be too long is refused.
func TestNameFired(t *testing.T) {
	t.Parallel()
	tick := nats.Header{contract.HeaderScheduler: {"schedules.report.nightly"}, contract.HeaderScheduleNext: {"2024-05-02T02:30:00Z"}}
	delayed := nats.Header{contract.HeaderScheduler: {"delayed.report.x"}, contract.HeaderScheduleNext: {"purge"}}
	for _, tc := range []struct {
		h    nats.Header
		want string
	}{{tick, "sched-nightly-42"}, {delayed, "sched-nightly"}, {nats.Header{}, "sched-nightly"}, {nil, "sched-nightly"}} {
		d := contract.JobData{ID: "sched-nightly", JobType: "report", Attempt: 1}
		require.NoError(t, d.NameFired(tc.h, 42))
		require.Equal(t, tc.want, d.ID)
	}
	long := contract.JobData{ID: strings.Repeat("x", contract.MaxIDLen-1), JobType: "report", Attempt: 1}
	require.ErrorIs(t, long.NameFired(tick, 42), contract.ErrInvalid)
}

func TestScheduleMessages(t *testing.T) {
	t.Parallel()
	now := time.Date(2024, 5, 1, 10, 0, 0, 0, time.UTC)
	job := contract.JobData{ID: "sched-nightly", JobType: "report", Attempt: 1, Priority: contract.PriorityLow}
	msg, err := contract.NewScheduleMsg("test", "nightly", "0 30 2 * * *", "Europe/Paris", job, now)
	require.NoError(t, err)
	require.Equal(t, "schedules.report.nightly", msg.Subject)
	require.Equal(t, "fired.jobs.report.low", msg.Header.Get(contract.HeaderScheduleTarget))
	require.Equal(t, "Europe/Paris", msg.Header.Get(contract.HeaderScheduleTimeZone))
	require.Empty(t, msg.Header.Get(contract.HeaderMsgID), "a schedule's change must not be dropped as a duplicate")
	// What the schedule fires decodes as the job on its JOBS subject.
	_, got, err := contract.DecodeJob("jobs.report.low", msg.Data)
	require.NoError(t, err)
	require.Equal(t, job.ID, got.ID)

	delayed, err := contract.NewDelayedJobMsg("test", contract.JobData{ID: "j1", JobType: "report", Attempt: 1}, now.Add(time.Hour), now)
	require.NoError(t, err)
	require.Equal(t, "delayed.report.j1", delayed.Subject)
	require.Equal(t, "@at 2024-05-01T11:00:00Z", delayed.Header.Get(contract.HeaderSchedule))
	require.Equal(t, "job:j1:1", delayed.Header.Get(contract.HeaderMsgID))

	for _, tc := range []struct{ pattern, tz, field string }{
		{"@every 500ms", "", "every"}, {"@every soon", "", "every"}, {"@every 1m", "UTC", "time_zone"},
		{"* * * * *", "", "cron"}, {"@at 2024-05-01T00:00:00Z", "", "cron"}, {"@daily", "Nowhere/Land", "time_zone"},
	} {
		err := contract.ValidateSchedulePattern(tc.pattern, tc.tz)
		var fe *contract.FieldError
		require.ErrorAs(t, err, &fe, tc.pattern)
		require.Equal(t, tc.field, fe.Field, tc.pattern)
	}
	for _, ok := range []string{"@every 1s", "@hourly", "0 */5 * * * *"} {
		require.NoError(t, contract.ValidateSchedulePattern(ok, ""), ok)
	}
	_, err = contract.NewScheduleMsg("test", "Nightly", "@daily", "", job, now)
	require.ErrorIs(t, err, contract.ErrInvalid, "a name is a lowercase token")
}
