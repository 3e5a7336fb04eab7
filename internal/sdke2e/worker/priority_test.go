package worker_test

import (
	"context"
	"fmt"
	"strings"
	"testing"
	"time"

	"github.com/nats-io/nats.go"
	"github.com/nats-io/nats.go/jetstream"
	"github.com/stretchr/testify/require"

	"github.com/retryd/retryd/pkg/contract"
	"github.com/retryd/retryd/pkg/errclass"
	"github.com/retryd/retryd/pkg/worker"
)

// nextJob waits for the next job a handler reported, up to wait.
func nextJob(t *testing.T, jobs <-chan *worker.Job, what string) *worker.Job {
	t.Helper()
	select {
	case j := <-jobs:
		return j
	case <-time.After(wait):
		t.Fatalf("%s: no job started within %s", what, wait)
		return nil
	}
}

// With the worker's only slot busy, 100 low and then 10 high priority jobs
// are queued; when the slot frees, every high job starts before the 11th
// low one (issue 17). Nothing is timed: the order of starts is compared.
func TestHigherPriorityJobsStartFirst(t *testing.T) {
	t.Parallel()
	b := setup(t)
	started := make(chan *worker.Job, 200)
	release := make(chan struct{})
	b.newWorker(t, worker.Config{Concurrency: 1}, map[string]worker.Handler{
		"work": func(ctx context.Context, job *worker.Job) error {
			started <- job
			if job.ID == "blocker" {
				select {
				case <-release:
				case <-ctx.Done():
					return ctx.Err()
				}
			}
			return nil
		},
	})
	b.enqueue(t, contract.JobData{ID: "blocker", JobType: "work"})
	require.Equal(t, "blocker", nextJob(t, started, "blocker").ID)

	// Enqueue returns once the stream stored the job: all 110 wait in
	// JOBS before the slot frees. Lows first, so that stream order alone
	// would run them first.
	for i := range 100 {
		b.enqueue(t, contract.JobData{ID: fmt.Sprintf("low-%03d", i), JobType: "work", Priority: contract.PriorityLow})
	}
	for i := range 10 {
		b.enqueue(t, contract.JobData{ID: fmt.Sprintf("high-%02d", i), JobType: "work", Priority: contract.PriorityHigh})
	}
	// The broker counts a consumer's new messages a moment after it
	// stores them (it signals its consumers asynchronously). Wait until
	// each band's consumer counts its jobs, so that the order below is
	// the broker's band order and not that moment's.
	for p, n := range map[contract.Priority]uint64{contract.PriorityHigh: 10, contract.PriorityLow: 100} {
		name := worker.BandConsumerName("work", p)
		require.Eventually(t, func() bool {
			info := b.consumerInfo(t, contract.StreamJobs, name)
			return info.NumPending+uint64(info.NumAckPending) == n
		}, wait, 5*time.Millisecond, "consumer %s never counted its %d jobs", name, n)
	}
	close(release)

	var order []string
	for range 110 {
		j := nextJob(t, started, fmt.Sprintf("after %d starts", len(order)))
		want := contract.PriorityLow
		if strings.HasPrefix(j.ID, "high-") {
			want = contract.PriorityHigh
		}
		require.Equal(t, want, j.Priority, j.ID)
		order = append(order, j.ID)
	}
	highs, lows, lowsBeforeLastHigh := 0, 0, 0
	for _, id := range order {
		switch {
		case strings.HasPrefix(id, "high-"):
			highs++
			lowsBeforeLastHigh = lows
		default:
			lows++
		}
	}
	require.Equal(t, 10, highs)
	require.Equal(t, 100, lows)
	require.Less(t, lowsBeforeLastHigh, 11, "every high job starts before the 11th low one: %v", order)
	// The worker keeps no job of its own, so the broker's band order is
	// exact here: the ten high jobs are the first ten to start.
	require.Zero(t, lowsBeforeLastHigh, "order of starts: %v", order)
	for i := range 10 {
		require.Equal(t, fmt.Sprintf("high-%02d", i), order[i], "high jobs start in the order they were queued")
	}
	for i := range 100 {
		require.Equal(t, fmt.Sprintf("low-%03d", i), order[10+i], "low jobs start in the order they were queued")
	}
	b.settled(t, contract.StreamJobs, worker.BandConsumerName("work", contract.PriorityHigh))
	b.settled(t, contract.StreamJobs, worker.BandConsumerName("work", contract.PriorityLow))
}

// A job that fails reports its priority, and the due that brings it back
// with that priority is routed to its band's subject: the retry runs in
// the band the job was enqueued in.
func TestRetriedJobKeepsItsPriority(t *testing.T) {
	t.Parallel()
	b := setup(t)
	jobs := make(chan *worker.Job, 4)
	b.newWorker(t, worker.Config{}, map[string]worker.Handler{
		"sync": func(_ context.Context, job *worker.Job) error {
			jobs <- job
			if job.Attempt == 1 {
				return errclass.New(errclass.Network, "connection reset")
			}
			return nil
		},
	})
	id := b.enqueue(t, contract.JobData{JobType: "sync", Priority: contract.PriorityHigh})
	first := nextJob(t, jobs, "first attempt")
	require.Equal(t, contract.PriorityHigh, first.Priority)
	ev := b.nextOutcome(t)
	require.Equal(t, contract.Failed, ev.Event)
	require.Equal(t, contract.PriorityHigh, ev.Failed.Priority, "the failure carries the priority to the scheduler")

	// What the scheduler sends back when the retry is due.
	publishDue(t, b.js, contract.DueData{Kind: contract.KindJob, ID: id, Attempt: 2, NextAttemptAt: time.Now(), JobType: "sync", Priority: ev.Failed.Priority})
	second := nextJob(t, jobs, "retry")
	require.Equal(t, id, second.ID)
	require.Equal(t, 2, second.Attempt)
	require.Equal(t, contract.PriorityHigh, second.Priority)
	require.Equal(t, contract.Succeeded, b.nextOutcome(t).Event)

	s, err := b.js.Stream(context.Background(), contract.StreamJobs)
	require.NoError(t, err)
	raw, err := s.GetLastMsgForSubject(context.Background(), "jobs.sync.high")
	require.NoError(t, err)
	require.Equal(t, contract.JobMsgID(id, 2), raw.Header.Get(contract.HeaderMsgID), "the retry was routed to the high band")
	_, err = s.GetLastMsgForSubject(context.Background(), "jobs.sync")
	require.ErrorIs(t, err, jetstream.ErrMsgNotFound, "nothing went to the normal band")
	b.settled(t, contract.StreamJobs, worker.BandConsumerName("sync", contract.PriorityHigh))
}

// A priority that is not a band is refused with a field error when a job
// is enqueued; a message that carries one anyway, or whose priority does
// not match its subject, is terminated and counted, and the jobs behind it
// run.
func TestUnknownPriorityIsRefused(t *testing.T) {
	t.Parallel()
	b := setup(t)
	for _, p := range []contract.Priority{"urgent", "HIGH", "5"} {
		_, err := worker.Enqueue(context.Background(), b.js, contract.JobData{JobType: "email", Priority: p})
		require.ErrorIs(t, err, contract.ErrInvalid)
		var fe *contract.FieldError
		require.ErrorAs(t, err, &fe)
		require.Equal(t, "data.priority", fe.Field)
	}

	ran := make(chan *worker.Job, 4)
	b.newWorker(t, worker.Config{}, map[string]worker.Handler{
		"email": func(_ context.Context, job *worker.Job) error {
			ran <- job
			return nil
		},
	})
	body := func(data string) []byte {
		return []byte(`{"specversion":"1.0","id":"x","source":"s","type":"job.requested","time":"2024-01-01T00:00:00Z","data":` + data + `}`)
	}
	for i, m := range []struct {
		subject, data string
	}{
		{"jobs.email", `{"id":"a","job_type":"email","attempt":1,"priority":"urgent"}`},
		{"jobs.email", `{"id":"b","job_type":"email","attempt":1,"priority":5}`},
		{"jobs.email", `{"id":"c","job_type":"email","attempt":1,"priority":"high"}`},
		{"jobs.email.high", `{"id":"d","job_type":"email","attempt":1}`},
		{"jobs.email.low", `{"id":"e","job_type":"email","attempt":1,"priority":"high"}`},
	} {
		msg := nats.NewMsg(m.subject)
		msg.Data = body(m.data)
		msg.Header.Set(contract.HeaderMsgID, fmt.Sprintf("bad-%d", i))
		_, err := b.js.PublishMsg(context.Background(), msg)
		require.NoError(t, err)
	}
	// A band JOBS does not have is not stored at all.
	_, err := b.js.Publish(context.Background(), "jobs.email.urgent", body(`{"id":"f","job_type":"email","attempt":1}`))
	require.Error(t, err)

	for _, p := range []contract.Priority{contract.PriorityLow, "", contract.PriorityHigh} {
		id := b.enqueue(t, contract.JobData{JobType: "email", Priority: p})
		j := nextJob(t, ran, "good job of band "+string(p.Band()))
		require.Equal(t, id, j.ID)
		require.Equal(t, p.Band(), j.Priority)
	}
	for _, p := range contract.Priorities {
		b.settled(t, contract.StreamJobs, worker.BandConsumerName("email", p))
	}
	require.Equal(t, 3.0, metric(t, b.reg, "retryd_worker_malformed_total", "worker-email"))
	require.Equal(t, 1.0, metric(t, b.reg, "retryd_worker_malformed_total", "worker-email=high"))
	require.Equal(t, 1.0, metric(t, b.reg, "retryd_worker_malformed_total", "worker-email=low"))
}

func TestBandConsumerNames(t *testing.T) {
	t.Parallel()
	require.Equal(t, "worker-email", worker.BandConsumerName("email", ""))
	require.Equal(t, "worker-email", worker.BandConsumerName("email", contract.PriorityNormal))
	require.Equal(t, "worker-email=high", worker.BandConsumerName("email", contract.PriorityHigh))
	require.Equal(t, "worker-email=low", worker.BandConsumerName("email", contract.PriorityLow))
	// A job type may end in "-high"; its consumer is not type email's
	// high band.
	require.NotEqual(t, worker.BandConsumerName("email-high", ""), worker.BandConsumerName("email", contract.PriorityHigh))
}
