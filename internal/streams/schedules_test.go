package streams_test

import (
	"encoding/json"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/nats-io/nats.go/jetstream"
	"github.com/stretchr/testify/require"

	"github.com/retryd/retryd/internal/natstest"
	"github.com/retryd/retryd/internal/streams"
	"github.com/retryd/retryd/pkg/contract"
)

// A periodic schedule on SCHEDULES fires into JOBS, once per tick, and
// each tick's job gets an id of its own; a delayed job arrives once with
// its own id, and its schedule is gone.
func TestSchedulesFireIntoJobs(t *testing.T) {
	t.Parallel()
	b := setup(t)
	require.NoError(t, streams.Ensure(b.ctx, b.js, streams.Options{}))
	now := time.Now()

	sched, err := contract.NewScheduleMsg("test", "every-second", "@every 1s", "",
		contract.JobData{ID: "sched-report", JobType: "report", Attempt: 1}, now)
	require.NoError(t, err)
	_, err = b.js.PublishMsg(b.ctx, sched)
	require.NoError(t, err)
	delayed, err := contract.NewDelayedJobMsg("test", contract.JobData{ID: "later-1", JobType: "mail", Attempt: 1}, now.Add(time.Second), now)
	require.NoError(t, err)
	_, err = b.js.PublishMsg(b.ctx, delayed)
	require.NoError(t, err)

	c, err := b.js.CreateConsumer(b.ctx, contract.StreamJobs, jetstream.ConsumerConfig{
		FilterSubjects: []string{"jobs.report", "jobs.mail"}, AckPolicy: jetstream.AckNonePolicy,
	})
	require.NoError(t, err)
	ids := map[string]bool{}
	deadline := time.Now().Add(15 * time.Second)
	for time.Now().Before(deadline) && len(ids) < 4 {
		batch, err := c.Fetch(10, jetstream.FetchMaxWait(time.Second))
		require.NoError(t, err)
		for m := range batch.Messages() {
			_, job, err := contract.DecodeJob(m.Subject(), m.Data())
			require.NoError(t, err, "a fired job decodes as any job")
			meta, err := m.Metadata()
			require.NoError(t, err)
			id := contract.FiredJobID(job, m.Headers(), meta.Sequence.Stream)
			require.False(t, ids[id], "tick %s delivered twice", id)
			ids[id] = true
		}
	}
	require.True(t, ids["later-1"], "the delayed job keeps its id: %v", ids)
	require.GreaterOrEqual(t, len(ids), 4, "three ticks and the delayed job: %v", ids)

	s, err := b.js.Stream(b.ctx, contract.StreamSchedules)
	require.NoError(t, err)
	_, err = s.GetLastMsgForSubject(b.ctx, contract.DelayedSubject("mail", "later-1"))
	require.ErrorIs(t, err, jetstream.ErrMsgNotFound, "a delayed job's schedule is gone once it fired")
	last, err := s.GetLastMsgForSubject(b.ctx, contract.ScheduleSubject("report", "every-second"))
	require.NoError(t, err, "a periodic schedule stays")
	require.Equal(t, "@every 1s", last.Header.Get(contract.HeaderSchedule))
}

// A full JOBS refuses what it sources from SCHEDULES without dropping it
// or its own old jobs: the server retries the source from the refused
// message, which arrives, once, when JOBS has room.
func TestFullJobsHoldsBackFiredJobs(t *testing.T) {
	t.Parallel()
	b := setup(t)
	require.NoError(t, streams.Ensure(b.ctx, b.js, streams.Options{}))
	jobs, err := b.js.Stream(b.ctx, contract.StreamJobs)
	require.NoError(t, err)
	natstest.SetMaxBytes(t, b.ctx, b.js, contract.StreamJobs, 2<<10) // below what Options allows
	now := time.Now()
	filled := 0
	for ; filled < 100; filled++ {
		msg, err := contract.NewJobMsg("test", contract.JobData{ID: "fill-" + strconv.Itoa(filled), JobType: "mail", Attempt: 1}, now)
		require.NoError(t, err)
		if _, err := b.js.PublishMsg(b.ctx, msg); err != nil {
			require.True(t, streams.Full(err), "%v", err)
			break
		}
	}
	require.Less(t, filled, 100, "JOBS filled up")

	// What a schedule fires, published as the server would; larger than
	// the job JOBS refused, so it cannot fit either.
	payload := json.RawMessage(`"` + strings.Repeat("x", 300) + `"`)
	fired, err := contract.NewJobMsg("test", contract.JobData{ID: "fired-1", JobType: "report", Attempt: 1, Payload: payload}, now)
	require.NoError(t, err)
	fired.Subject = "fired." + fired.Subject
	_, err = b.js.PublishMsg(b.ctx, fired)
	require.NoError(t, err, "SCHEDULES takes it")
	info, err := jobs.Info(b.ctx)
	require.NoError(t, err)
	require.Equal(t, uint64(filled), info.State.Msgs, "no room for it yet")

	natstest.SetMaxBytes(t, b.ctx, b.js, contract.StreamJobs, streams.DefaultMaxBytes[contract.StreamJobs])
	require.Eventually(t, func() bool {
		info, err = jobs.Info(b.ctx)
		return err == nil && info.State.Msgs > uint64(filled)
	}, 30*time.Second, 50*time.Millisecond, "the fired job arrives once JOBS has room")
	require.Equal(t, uint64(1), info.State.FirstSeq, "no old job was discarded")
	require.Equal(t, uint64(filled+1), info.State.Msgs, "the fired job arrived once")
	last, err := jobs.GetLastMsgForSubject(b.ctx, contract.JobSubject("report"))
	require.NoError(t, err)
	_, job, err := contract.DecodeJob(last.Subject, last.Data)
	require.NoError(t, err)
	require.Equal(t, "fired-1", job.ID)
}
