package jobs_test

import (
	"context"
	"net/http"
	"net/http/httptest"
	"sync"
	"testing"
	"time"

	"github.com/stretchr/testify/require"

	"github.com/retryd/retryd/internal/audit"
	"github.com/retryd/retryd/internal/serve"
	"github.com/retryd/retryd/internal/servicetest"
	"github.com/retryd/retryd/pkg/worker"
	"github.com/retryd/retryd/services/jobs"
	"github.com/retryd/retryd/stores/jobstore"
)

// A schedule that fires every second for 10 seconds runs one job a tick,
// each once, while the service that manages it (the jobs API and its
// projection) is stopped and started again half way: the ticks come
// from JetStream, not from a timer of the service.
func TestScheduleFiresOncePerTickAcrossARestart(t *testing.T) {
	t.Parallel()
	b := setupAPI(t, jobs.APIConfig{})
	b.start(t, b.api)
	proj := b.startProjector(t, jobs.ProjectorConfig{})

	var mu sync.Mutex
	runs := map[string]int{}
	w, err := worker.New(worker.Config{JS: b.js, FetchWait: 200 * time.Millisecond})
	require.NoError(t, err)
	require.NoError(t, w.Handle("heartbeat", func(_ context.Context, job *worker.Job) error {
		mu.Lock()
		defer mu.Unlock()
		runs[job.ID]++
		return nil
	}))
	require.NoError(t, w.Start(b.ctx))
	servicetest.StopOnCleanup(t, 10*time.Second, w.Stop)

	var view jobs.ScheduleView
	require.Equal(t, http.StatusOK, b.do(t, http.MethodPut, "/v1/schedules/heartbeat/every-second",
		`{"every":"1s","payload":{"check":"db"},"max_retries":1}`, &view))
	require.Equal(t, "@every 1s", view.Pattern)
	require.Equal(t, "sched-every-second", view.JobID)
	start := time.Now()

	time.Sleep(5 * time.Second) // the first half of the schedule's life
	require.NoError(t, b.api.Stop(b.ctx))
	require.NoError(t, proj.Stop(b.ctx))
	b.srv.Close()
	api, err := jobs.NewAPI(jobs.APIConfig{Pool: b.pool, Retry: b.rec, JS: b.js, Logger: b.log})
	require.NoError(t, err)
	b.start(t, api)
	b.srv = httptest.NewServer(serve.Guard{}.Handler(api.Handler()))
	t.Cleanup(b.srv.Close)
	b.startProjector(t, jobs.ProjectorConfig{})

	time.Sleep(time.Until(start.Add(10 * time.Second)))
	resp, raw := servicetest.Request(t, b.ctx, http.MethodDelete, b.srv.URL+"/v1/schedules/heartbeat/every-second", nil)
	require.Equal(t, http.StatusNoContent, resp.StatusCode, string(raw))
	ended := time.Now()

	fired := b.jobMessages(t, "jobs.heartbeat")
	require.InDelta(t, 10, len(fired), 2, "one job a second for about 10 s")
	// Every tick's job was run exactly once and reached the projection.
	require.Eventually(t, func() bool {
		mu.Lock()
		defer mu.Unlock()
		return len(runs) == len(fired)
	}, wait, 50*time.Millisecond)
	mu.Lock()
	for id, n := range runs {
		require.Equal(t, 1, n, "tick job %s ran %d times", id, n)
	}
	mu.Unlock()
	require.Eventually(t, func() bool {
		var page jobstore.Page
		b.do(t, http.MethodGet, "/v1/jobs?job_type=heartbeat&limit=100", "", &page)
		return len(page.Jobs) == len(fired)
	}, wait, 50*time.Millisecond)

	// Deleted, it fires no more.
	time.Sleep(2 * time.Second)
	require.Len(t, b.jobMessages(t, "jobs.heartbeat"), len(fired), "fired after the delete at %s", ended)
	require.Equal(t, http.StatusNotFound, b.do(t, http.MethodGet, "/v1/schedules/heartbeat/every-second", "", nil))
}

// The schedule API: create, replace, list, read and delete, each change
// in the audit log; a pattern it cannot run is a 400 naming the field.
func TestScheduleAPI(t *testing.T) {
	t.Parallel()
	b := setupAPI(t, jobs.APIConfig{})
	var view jobs.ScheduleView
	require.Equal(t, http.StatusOK, b.do(t, http.MethodPut, "/v1/schedules/report/nightly",
		`{"cron":"0 30 2 * * *","time_zone":"Europe/Paris","priority":"low","metadata":{"team":"ops"}}`, &view))
	require.Equal(t, "0 30 2 * * *", view.Pattern)
	require.Equal(t, "Europe/Paris", view.TimeZone)
	require.Equal(t, "low", string(view.Priority))
	require.Equal(t, http.StatusOK, b.do(t, http.MethodPut, "/v1/schedules/report/hourly", `{"cron":"@hourly"}`, nil))
	// A PUT replaces: the subject keeps one version.
	require.Equal(t, http.StatusOK, b.do(t, http.MethodPut, "/v1/schedules/report/hourly", `{"every":"1h"}`, &view))
	require.Equal(t, "@every 1h", view.Pattern)

	var list jobs.ScheduleList
	require.Equal(t, http.StatusOK, b.do(t, http.MethodGet, "/v1/schedules", "", &list))
	require.Len(t, list.Schedules, 2)
	require.Equal(t, "hourly", list.Schedules[0].Name)
	require.Equal(t, "@every 1h", list.Schedules[0].Pattern)
	require.Equal(t, "nightly", list.Schedules[1].Name)

	for _, tc := range []struct{ path, body, field string }{
		{"/v1/schedules/report/x", `{}`, "every"},
		{"/v1/schedules/report/x", `{"every":"1s","cron":"@daily"}`, "every"},
		{"/v1/schedules/report/x", `{"every":"500ms"}`, "every"},
		{"/v1/schedules/report/x", `{"cron":"* * *"}`, "cron"},
		{"/v1/schedules/report/x", `{"cron":"0 0 * * * *","time_zone":"Mars/Olympus"}`, "time_zone"},
		{"/v1/schedules/report/Bad", `{"every":"1s"}`, "name"},
		{"/v1/schedules/Report/x", `{"every":"1s"}`, "job_type"},
		{"/v1/schedules/report/x", `{"every":"1s","payload":{"a":1},"extra":true}`, "extra"},
	} {
		var e serve.ErrorBody
		require.Equal(t, http.StatusBadRequest, b.do(t, http.MethodPut, tc.path, tc.body, &e), tc.body)
		require.Equal(t, tc.field, e.Error.Field, tc.body)
	}

	resp, raw := servicetest.Request(t, b.ctx, http.MethodDelete, b.srv.URL+"/v1/schedules/report/nightly", nil)
	require.Equal(t, http.StatusNoContent, resp.StatusCode, string(raw))
	require.Equal(t, http.StatusNotFound, b.do(t, http.MethodDelete, "/v1/schedules/report/nightly", "", nil))
	require.Equal(t, http.StatusOK, b.do(t, http.MethodGet, "/v1/schedules", "", &list))
	require.Len(t, list.Schedules, 1)

	page, err := audit.List(b.ctx, b.pool, audit.Filter{Limit: 10})
	require.NoError(t, err)
	var actions []string
	for _, e := range page.Entries {
		actions = append(actions, e.Action+" "+e.Target)
	}
	require.ElementsMatch(t, []string{
		"schedule.put schedule/report/nightly", "schedule.put schedule/report/hourly",
		"schedule.put schedule/report/hourly", "schedule.delete schedule/report/nightly",
	}, actions)
}
