package main

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"log/slog"
	"net/http"
	"net/http/httptest"
	"os"
	"path/filepath"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/jackc/pgx/v5/pgxpool"
	"github.com/nats-io/nats-server/v2/server"
	"github.com/nats-io/nats.go"
	"github.com/nats-io/nats.go/jetstream"
	"github.com/prometheus/client_golang/prometheus"
	"github.com/rs/zerolog"
	slogzerolog "github.com/samber/slog-zerolog/v2"
	"github.com/stretchr/testify/require"

	"github.com/retryd/retryd/cmd/retryd/internal/devcerts"
	"github.com/retryd/retryd/internal/natsconn"
	"github.com/retryd/retryd/internal/serve"
	"github.com/retryd/retryd/internal/streams"
	"github.com/retryd/retryd/migrations/pgtest"
	"github.com/retryd/retryd/pkg/contract"
	"github.com/retryd/retryd/pkg/errclass"
	"github.com/retryd/retryd/pkg/worker"
	"github.com/retryd/retryd/services/ingress"
	"github.com/retryd/retryd/services/jobs"
	"github.com/retryd/retryd/services/scheduler"
	"github.com/retryd/retryd/services/triggers"
	"github.com/retryd/retryd/stores/retrystore"
)

const natsConfPath = "../../deploy/nats/nats-server.conf"

// natsUsers are the users of deploy/nats/nats-server.conf and the
// environment variable holding each one's password.
var natsUsers = map[string]string{
	"sys": "SYS_NATS_PASSWORD", "admin": "ADMIN_NATS_PASSWORD", "scheduler": "SCHEDULER_NATS_PASSWORD",
	"ingress": "INGRESS_NATS_PASSWORD", "triggers": "TRIGGERS_NATS_PASSWORD", "worker": "WORKER_NATS_PASSWORD",
	"producer": "PRODUCER_NATS_PASSWORD", "runner": "RUNNER_NATS_PASSWORD", "operator": "OPERATOR_NATS_PASSWORD",
}

func password(user string) string { return user + "-test-secret" }

// loadNATSConfig loads deploy/nats/nats-server.conf the way nats-server
// does, with its TLS files and store directory moved into a temporary
// directory. It sets the password variables: the caller is not parallel.
func loadNATSConfig(t *testing.T) (*server.Options, devcerts.Files) {
	t.Helper()
	for user, env := range natsUsers {
		t.Setenv(env, password(user))
	}
	dir := t.TempDir()
	certs, _, err := devcerts.Generate(filepath.Join(dir, "tls"), []string{"localhost", "127.0.0.1"}, 24*time.Hour, false)
	require.NoError(t, err)
	raw, err := os.ReadFile(natsConfPath)
	require.NoError(t, err)
	conf := strings.ReplaceAll(string(raw), `"/etc/nats/tls/`, `"`+filepath.Join(dir, "tls")+"/")
	conf = strings.Replace(conf, `store_dir: "/data"`, `store_dir: "`+filepath.Join(dir, "data")+`"`, 1)
	require.NotEqual(t, string(raw), conf, "the config names /etc/nats/tls and /data")
	path := filepath.Join(dir, "nats-server.conf")
	require.NoError(t, os.WriteFile(path, []byte(conf), 0o600))
	opts, err := server.ProcessConfigFile(path)
	require.NoError(t, err)
	return opts, certs
}

// TestNATSConfig loads the deployment's NATS configuration, checks its
// settings, then runs every retryd component under its own user against
// it: whatever a component needs and its permissions deny fails here.
// Not parallel: it sets environment variables.
func TestNATSConfig(t *testing.T) {
	opts, certs := loadNATSConfig(t)
	require.True(t, opts.JetStream)
	require.True(t, opts.SyncAlways, "jetstream sync_interval: always")
	require.NotNil(t, opts.TLSConfig, "clients connect over TLS")
	require.EqualValues(t, 1<<20, opts.MaxPayload)
	require.Equal(t, "SYS", opts.SystemAccount)
	users := map[string]*server.User{}
	for _, u := range opts.Users {
		users[u.Username] = u
		require.Equal(t, password(u.Username), u.Password, "password of %s comes from the environment", u.Username)
	}
	for user := range natsUsers {
		require.Contains(t, users, user)
	}
	for _, u := range []string{"scheduler", "ingress", "triggers", "worker", "producer", "runner"} {
		require.Equal(t, "RETRYD", users[u].Account.Name)
		subs := []string{"_INBOX_" + u + ".>"}
		if u == "worker" {
			// Core NATS, no consumer: a worker follows the decisions of
			// the failures it reported, to keep them until then.
			subs = append(subs, "retry.job.*.*")
		}
		require.Equal(t, subs, users[u].Permissions.Subscribe.Allow, "%s subscribes to its own replies only (a worker: and its jobs' lifecycle)", u)
		require.NotContains(t, users[u].Permissions.Publish.Allow, ">", u)
	}
	require.NotContains(t, users["operator"].Permissions.Publish.Allow, ">", "operator is read-only")
	require.Equal(t, "_INBOX_operator.>", users["operator"].Permissions.Subscribe.Allow[0])

	opts.Host, opts.Port, opts.HTTPPort = "127.0.0.1", -1, 0
	opts.NoSigs, opts.NoLog = true, true
	srv, err := server.NewServer(opts)
	require.NoError(t, err)
	go srv.Start()
	require.True(t, srv.ReadyForConnections(10*time.Second))
	t.Cleanup(func() { srv.Shutdown(); srv.WaitForShutdown() })
	url := strings.Replace(srv.ClientURL(), "nats://", "tls://", 1)

	ctx, cancel := context.WithTimeout(context.Background(), 2*time.Minute)
	t.Cleanup(cancel)
	log := testLogger(t)
	connect := func(user string) jetstream.JetStream {
		o := natsconn.Options{URL: url, Name: "test-" + user, User: user, Password: password(user), TLSCA: certs.CA}
		if user != "admin" {
			o.InboxPrefix = "_INBOX_" + user
		}
		nc, js, err := natsconn.Connect(ctx, o, log)
		require.NoError(t, err, user)
		t.Cleanup(nc.Close)
		return js
	}
	require.NoError(t, streams.Ensure(ctx, connect("admin"), streams.Options{}))

	dbURL := pgtest.NewDatabaseURL(t)
	pool, err := pgxpool.New(ctx, dbURL)
	require.NoError(t, err)
	t.Cleanup(pool.Close)
	// Each service connects as its own Postgres role, granted what
	// `retryd migrate` grants: a table a service uses and its role lacks
	// fails here. The test's own checks read with pool.
	pools := servicePools(ctx, t, dbURL)
	stop := func(name string, f func(context.Context) error) {
		t.Cleanup(func() {
			sctx, scancel := context.WithTimeout(context.Background(), 20*time.Second)
			defer scancel()
			require.NoError(t, f(sctx), "stop %s", name)
		})
	}

	schedJS := connect("scheduler")
	sched, err := scheduler.New(scheduler.Config{Pool: pools.scheduler, JS: schedJS, Logger: log, Registerer: prometheus.NewRegistry(), MaxIdle: 100 * time.Millisecond})
	require.NoError(t, err)
	require.NoError(t, sched.Start(ctx))
	stop("scheduler", sched.Stop)
	proj, err := jobs.NewProjector(jobs.ProjectorConfig{Pool: pools.scheduler, JS: schedJS, Logger: log, FetchWait: 200 * time.Millisecond})
	require.NoError(t, err)
	require.NoError(t, proj.Start(ctx))
	stop("jobs projection", proj.Stop)
	api, err := jobs.NewAPI(jobs.APIConfig{Pool: pools.scheduler, Retry: scheduler.RetryController{S: sched}, JS: schedJS, Logger: log})
	require.NoError(t, err)

	ing, err := ingress.New(ingress.Config{Pool: pools.ingress, JS: connect("ingress"), Logger: log})
	require.NoError(t, err)
	require.NoError(t, ing.Start(ctx))
	stop("ingress", ing.Stop)

	trig, err := triggers.New(triggers.Config{Pool: pools.triggers, JS: connect("triggers"), Logger: log})
	require.NoError(t, err)
	require.NoError(t, trig.Start(ctx))
	stop("triggers", trig.Stop)

	workerJS := connect("worker")
	workerReg := prometheus.NewRegistry()
	w, err := worker.New(worker.Config{JS: workerJS, Logger: slog.New(slogzerolog.Option{Logger: &log, NoTimestamp: true}.NewZerologHandler()), FetchWait: 200 * time.Millisecond, Registerer: workerReg})
	require.NoError(t, err)
	// ran records each attempt's priority band, as the worker saw it.
	var ran sync.Map
	require.NoError(t, w.Handle("perm_job", func(_ context.Context, j *worker.Job) error {
		ran.Store(fmt.Sprintf("%s:%d", j.ID, j.Attempt), j.Priority)
		if j.Attempt == 1 {
			return errclass.New(errclass.Temporary, "first attempt fails")
		}
		return nil
	}))
	require.NoError(t, w.Start(ctx))
	stop("worker", w.Stop)

	mux := http.NewServeMux()
	mux.Handle("/v1/events", ing.Handler())
	mux.Handle("/v1/events/", ing.Handler())
	mux.Handle("/v1/sources", ing.Handler())
	mux.Handle("/v1/triggers", trig.Handler())
	mux.Handle("/v1/triggers/", trig.Handler())
	mux.Handle("/v1/policies/", sched.Handler())
	api.Register(mux)
	httpSrv := httptest.NewServer(serve.Guard{}.Handler(mux))
	t.Cleanup(httpSrv.Close)
	b := &bundle{api: httpSrv.URL, ctx: ctx}

	t.Run("job retried through scheduler, due router, worker and projection", func(t *testing.T) {
		b.ok(t, "policies", "set", "job", "perm_job", "--max-retries", "2", "--base-delay", "10ms", "--max-delay", "20ms")
		id, err := worker.Enqueue(ctx, workerJS, contract.JobData{JobType: "perm_job"})
		require.NoError(t, err)
		require.Eventually(t, func() bool {
			r, err := retrystore.Get(ctx, pool, contract.KindJob, id)
			return err == nil && r.State == retrystore.StateSucceeded
		}, wait, 20*time.Millisecond)
		require.Eventually(t, func() bool {
			var a analyticsView
			b.okJSON(t, &a, "analytics")
			return len(a.JobTypes) == 1 && a.JobTypes[0].Succeeded == 1
		}, wait, 50*time.Millisecond, "the projection (scheduler user) folds JOBS and RETRIES")
		// The worker saw the decision of its failure on its subscription
		// to the job's lifecycle, and keeps nothing.
		require.Eventually(t, func() bool {
			families, err := workerReg.Gather()
			require.NoError(t, err)
			for _, f := range families {
				if f.GetName() == "retryd_worker_pending_facts" {
					return f.GetMetric()[0].GetGauge().GetValue() == 0
				}
			}
			return false
		}, wait, 20*time.Millisecond, "the worker user follows its jobs' decisions")
		// The gateway's dashboard counts, as the read-only role.
		sum, err := scheduler.Summary(ctx, pools.readOnly)
		require.NoError(t, err)
		require.NotEmpty(t, sum.Counts)
	})

	t.Run("high priority job retried in its band", func(t *testing.T) {
		b.ok(t, "policies", "set", "job", "perm_job", "--max-retries", "2", "--base-delay", "10ms", "--max-delay", "20ms")
		id, err := worker.Enqueue(ctx, workerJS, contract.JobData{JobType: "perm_job", Priority: contract.PriorityHigh})
		require.NoError(t, err)
		require.Eventually(t, func() bool {
			r, err := retrystore.Get(ctx, pool, contract.KindJob, id)
			return err == nil && r.State == retrystore.StateSucceeded
		}, wait, 20*time.Millisecond)
		r, err := retrystore.Get(ctx, pool, contract.KindJob, id)
		require.NoError(t, err)
		require.Equal(t, "high", r.Priority, "the scheduler kept the band of the failure")
		for _, attempt := range []int{1, 2} {
			p, ok := ran.Load(fmt.Sprintf("%s:%d", id, attempt))
			require.True(t, ok, "attempt %d ran", attempt)
			require.Equal(t, contract.PriorityHigh, p, "attempt %d ran in the high band", attempt)
		}
		require.Eventually(t, func() bool {
			var v jobView
			b.okJSON(t, &v, "jobs", "show", id)
			return v.Job != nil && v.Job.Status == "completed" && v.Job.Priority == "high"
		}, wait, 20*time.Millisecond, "the projection shows the band")
	})

	t.Run("jobs enqueued over HTTP, delayed and on a schedule", func(t *testing.T) {
		// The jobs API (scheduler user) publishes on JOBS, delays on
		// SCHEDULES and keeps schedules there; JOBS copies what fires.
		var now, later enqueued
		b.okJSON(t, &now, "jobs", "enqueue", "perm_job", "--idempotency-key", "perm-now")
		b.okJSON(t, &later, "jobs", "enqueue", "perm_job", "--id", "perm-later", "--in", "1s")
		b.ok(t, "schedules", "create", "perm_job", "perm-tick", "--every", "1s")
		var list scheduleList
		b.okJSON(t, &list, "schedules", "list")
		require.Len(t, list.Schedules, 1)
		ticked := func() bool {
			found := false
			ran.Range(func(k, _ any) bool {
				found = strings.HasPrefix(k.(string), "sched-perm-tick-")
				return !found
			})
			return found
		}
		require.Eventually(t, func() bool {
			_, a := ran.Load(now.ID + ":1")
			_, b := ran.Load("perm-later:1")
			return a && b && ticked()
		}, wait, 20*time.Millisecond, "the worker ran the job, the delayed job and a tick")
		b.ok(t, "schedules", "delete", "perm_job", "perm-tick")
	})

	t.Run("event admitted and delivered, run launched and finished", func(t *testing.T) {
		out := b.ok(t, "sources", "list") // ingress answers
		require.Contains(t, out, "No source")
		postJSON(t, httpSrv.URL+"/v1/triggers", `{"id":"perm-trigger","name":"perm","source":"perm","event_type":"thing.happened","workflow":"perm_flow"}`)
		// The workflow engine under the runner user reports a node and
		// fails each run's first attempt, then completes the retry: the
		// triggers user reports the failure to the scheduler, reads the
		// run's request back and launches it again (docs/runs.md).
		_, err := pool.Exec(ctx, `UPDATE retry_policies SET base_delay_ms = 10, max_delay_ms = 20 WHERE kind = 'run' AND job_type = ''`)
		require.NoError(t, err)
		runnerJS := connect("runner")
		cons, err := runnerJS.CreateOrUpdateConsumer(ctx, "RUNS", jetstream.ConsumerConfig{
			Durable: "runner", FilterSubject: "runs.*.requested.*", AckPolicy: jetstream.AckExplicitPolicy,
		})
		require.NoError(t, err)
		cc, err := cons.Consume(func(m jetstream.Msg) {
			_, run, err := contract.DecodeRunRequested(m.Subject(), m.Data())
			if err != nil {
				return
			}
			attempt := max(run.Attempt, 1)
			step := contract.RunStepData{RunID: run.RunID, Workflow: run.Workflow, Attempt: attempt, Node: "only", Status: contract.StepCompleted}
			event, end := contract.RunCompleted, contract.RunFinishedData{RunID: run.RunID, Workflow: run.Workflow, Attempt: attempt}
			if attempt == 1 {
				step.Status, step.Error = contract.StepFailed, &contract.ErrorInfo{Class: "temporary", Message: "first attempt fails"}
				event, end.Error = contract.RunFailed, step.Error
			}
			for _, out := range []struct {
				event string
				data  interface{ Validate() error }
			}{{contract.RunStep, step}, {event, end}} {
				msg, err := contract.NewRunMsg("test-runner", out.event, out.data, time.Now())
				if err == nil {
					_, err = runnerJS.PublishMsg(ctx, msg)
				}
				if err != nil {
					t.Errorf("runner: publish %s: %v", out.event, err)
					return
				}
			}
			_ = m.Ack()
		})
		require.NoError(t, err)
		t.Cleanup(cc.Stop)

		// One event over HTTP (ingress publishes it), one over NATS as a producer.
		postJSON(t, httpSrv.URL+"/v1/events", `{"id":"perm-evt-1","source":"perm","type":"thing.happened","data":{}}`)
		msg, err := contract.NewEventMsg(contract.IngestSubject("perm"), contract.Envelope{SpecVersion: "1.0", ID: "perm-evt-2",
			Source: "perm", Type: "thing.happened", Time: time.Now().UTC(), DataContentType: "application/json", Data: []byte(`{}`)})
		require.NoError(t, err)
		_, err = connect("producer").PublishMsg(ctx, msg)
		require.NoError(t, err)

		for _, id := range []string{"perm-evt-1", "perm-evt-2"} {
			require.Eventually(t, func() bool {
				var status string
				err := pool.QueryRow(ctx, `SELECT r.status FROM workflow_trigger_deliveries d JOIN workflow_runs r ON r.run_id = d.run_id
					WHERE d.event_id = $1`, id).Scan(&status)
				return err == nil && status == "completed"
			}, wait, 20*time.Millisecond, "event %s admitted, delivered, run launched, failed, retried and completed", id)
			var attempt int
			require.NoError(t, pool.QueryRow(ctx, `SELECT r.attempt FROM workflow_trigger_deliveries d JOIN workflow_runs r ON r.run_id = d.run_id
				WHERE d.event_id = $1`, id).Scan(&attempt))
			require.Equal(t, 2, attempt, id)
		}
	})

	t.Run("what a user may not do", func(t *testing.T) {
		for _, tc := range []struct {
			user, action, subject string
		}{
			{"producer", "pub", "events.perm.thing"},
			{"producer", "pub", "retry.job.failed.x"},
			{"worker", "pub", "retry.job.scheduled.x"},
			{"worker", "pub", "retry.event.held.x"},
			{"worker", "pub", "$JS.API.STREAM.DELETE.RETRIES"},
			// A worker may read the last outcome of a job, not other
			// kinds' lifecycle messages (their payloads).
			{"worker", "pub", "$JS.API.DIRECT.GET.RETRIES.retry.event.failed.x"},
			{"worker", "pub", "$JS.API.STREAM.MSG.GET.RETRIES"},
			{"worker", "sub", "retry.event.failed.x"},
			{"worker", "sub", "retry.>"},
			{"ingress", "pub", "retry.job.failed.x"},
			{"ingress", "pub", "retry.event-trigger.held.x"},
			{"triggers", "pub", "retry.event.released.x"},
			{"scheduler", "pub", "retry.event.held.x"},
			{"triggers", "pub", "jobs.x"},
			{"scheduler", "pub", "ingest.x"},
			{"scheduler", "sub", "retry.>"},
			{"runner", "pub", "runs.x.requested.y"},
			{"runner", "pub", "retry.run.failed.y"},
			{"triggers", "pub", "retry.run.scheduled.y"},
			// Replies are private: nobody reads another user's inbox (a
			// worker's pulled jobs arrive on _INBOX_worker).
			{"producer", "sub", "_INBOX.>"},
			{"producer", "sub", "_INBOX_worker.>"},
			{"producer", "sub", "_INBOX_worker.abc.*"},
			{"producer", "sub", "_INBOX_operator.>"},
			{"operator", "sub", "_INBOX_worker.>"},
			{"operator", "sub", "_INBOX.>"},
			{"ingress", "sub", "_INBOX_scheduler.>"},
			{"runner", "sub", ">"},
			// Services may create a missing stream, never change,
			// purge or delete one: max_msgs=1 would drop its messages.
			{"scheduler", "pub", "$JS.API.STREAM.UPDATE.RETRIES"},
			{"ingress", "pub", "$JS.API.STREAM.UPDATE.INGEST"},
			{"triggers", "pub", "$JS.API.STREAM.PURGE.EVENTS"},
			{"scheduler", "pub", "$JS.API.STREAM.DELETE.RETRIES"},
		} {
			require.True(t, denied(t, url, certs.CA, tc.user, tc.action, tc.subject), "%s may %s %s", tc.user, tc.action, tc.subject)
		}
		// No service user changes, purges or deletes a stream.
		for _, u := range []string{"scheduler", "ingress", "triggers", "worker", "producer", "runner"} {
			for _, op := range []string{"UPDATE", "DELETE", "PURGE"} {
				require.True(t, denied(t, url, certs.CA, u, "pub", "$JS.API.STREAM."+op+".RETRIES"), "%s may %s RETRIES", u, op)
			}
		}
		// And the opposite check: an allowed subject is not reported.
		require.False(t, denied(t, url, certs.CA, "producer", "pub", "ingest.perm"))
		// Holds and releases are the owners' facts.
		require.False(t, denied(t, url, certs.CA, "ingress", "pub", "retry.event.held.x"))
		require.False(t, denied(t, url, certs.CA, "ingress", "pub", "retry.event.released.x"))
		require.False(t, denied(t, url, certs.CA, "triggers", "pub", "retry.event-trigger.held.x"))
		require.False(t, denied(t, url, certs.CA, "triggers", "pub", "retry.event-trigger.released.x"))
		require.False(t, denied(t, url, certs.CA, "worker", "pub", "retry.job.held.x"))
		require.False(t, denied(t, url, certs.CA, "worker", "pub", "retry.job.released.x"))
		require.False(t, denied(t, url, certs.CA, "worker", "pub", "$JS.API.DIRECT.GET.RETRIES.retry.job.succeeded.x"))
		require.False(t, denied(t, url, certs.CA, "worker", "sub", "_INBOX_worker.abc.*"))
		// It follows the decisions of the failures it reported.
		require.False(t, denied(t, url, certs.CA, "worker", "sub", "retry.job.*.01JQ7Z3K5W8E4M2V6T0B9XN1CD"))
		// The workflow engine renews its runs' leases.
		require.False(t, denied(t, url, certs.CA, "runner", "pub", "runs.x.heartbeat.y"))
	})

	t.Run("operator reads and writes nothing", func(t *testing.T) {
		o := natsconn.Options{URL: url, Name: "test-operator", User: "operator", Password: password("operator"),
			TLSCA: certs.CA, InboxPrefix: "_INBOX_operator"}
		nc, js, err := natsconn.Connect(ctx, o, log)
		require.NoError(t, err)
		t.Cleanup(nc.Close)

		// nats stream ls, stream info.
		var names []string
		lister := js.StreamNames(ctx)
		for n := range lister.Name() {
			names = append(names, n)
		}
		require.NoError(t, lister.Err())
		require.ElementsMatch(t, []string{"INGEST", "EVENTS", "RETRIES", "RUNS", "SCHEDULES", "JOBS"}, names)
		stream, err := js.Stream(ctx, "RETRIES")
		require.NoError(t, err)
		require.Positive(t, stream.CachedInfo().State.Msgs, "the job subtest left lifecycle facts")
		// nats consumer info on a service's durable.
		cons, err := js.Consumer(ctx, "RETRIES", "scheduler")
		require.NoError(t, err)
		require.Equal(t, "scheduler", cons.CachedInfo().Name)
		// nats stream get, by sequence and --last-for; nats stream
		// subjects; the direct get a worker uses too.
		_, err = stream.GetMsg(ctx, 1)
		require.NoError(t, err)
		first, err := stream.GetMsg(ctx, 1, jetstream.WithGetMsgSubject("retry.job.>"))
		require.NoError(t, err, "the operator pages RETRIES by sequence and subject")
		require.True(t, strings.HasPrefix(first.Subject, "retry.job."), first.Subject)
		_, err = stream.GetLastMsgForSubject(ctx, first.Subject)
		require.NoError(t, err)
		withSubjects, err := stream.Info(ctx, jetstream.WithSubjectFilter("retry.job.>"))
		require.NoError(t, err)
		require.Contains(t, withSubjects.State.Subjects, first.Subject)
		require.False(t, denied(t, url, certs.CA, "operator", "pub", "$JS.API.DIRECT.GET.RETRIES."+first.Subject))

		// nats sub 'retry.>': a job's first failure arrives live.
		sub, err := nc.SubscribeSync("retry.>")
		require.NoError(t, err)
		require.NoError(t, nc.Flush())
		id, err := worker.Enqueue(ctx, workerJS, contract.JobData{JobType: "perm_job"})
		require.NoError(t, err)
		deadline := time.Now().Add(wait)
		for {
			m, err := sub.NextMsg(time.Until(deadline))
			require.NoError(t, err, "the operator sees the job's lifecycle on retry.>")
			if strings.HasSuffix(m.Subject, "."+id) {
				break
			}
		}

		// Nothing that writes.
		for _, subject := range []string{
			"retry.job.failed.x", "retry.job.due.x", "ingest.x", "events.x.y", "jobs.x", "runs.x.requested.y",
			"$JS.API.STREAM.CREATE.X", "$JS.API.STREAM.UPDATE.RETRIES", "$JS.API.STREAM.DELETE.RETRIES",
			"$JS.API.STREAM.PURGE.RETRIES", "$JS.API.STREAM.MSG.DELETE.RETRIES",
			"$JS.API.CONSUMER.DELETE.RETRIES.scheduler", "$JS.API.CONSUMER.DURABLE.CREATE.RETRIES.x",
			"$JS.ACK.RETRIES.scheduler.1.1.1.1.1",
			"$JS.API.CONSUMER.CREATE.JOBS.worker-perm_job", "$JS.API.CONSUMER.MSG.NEXT.JOBS.worker-perm_job",
			// No consumer of its own, in any of the four forms of a create:
			// nothing it creates can deliver into a stream or outlive it.
			"$JS.API.CONSUMER.CREATE.EVENTS", "$JS.API.CONSUMER.CREATE.EVENTS.probe",
			"$JS.API.CONSUMER.CREATE.EVENTS.probe.events.>", "$JS.API.CONSUMER.DURABLE.CREATE.EVENTS.probe",
			"$JS.API.CONSUMER.CREATE.RETRIES.probe.retry.job.>",
		} {
			require.True(t, denied(t, url, certs.CA, "operator", "pub", subject), "operator may publish %s", subject)
		}
		require.False(t, denied(t, url, certs.CA, "operator", "pub", "$JS.API.STREAM.INFO.RETRIES"))
		require.False(t, denied(t, url, certs.CA, "operator", "sub", "retry.>"))
		// Creating a consumer that names a service's durable would update
		// it, pulling from it would take its messages: every durable some
		// user of the file pulls from is denied to the operator.
		checked := 0
		for _, u := range opts.Users {
			if u.Username == "operator" || u.Permissions == nil || u.Permissions.Publish == nil {
				continue
			}
			for _, allow := range u.Permissions.Publish.Allow {
				rest, ok := strings.CutPrefix(allow, "$JS.API.CONSUMER.MSG.NEXT.")
				if !ok {
					continue
				}
				durable := strings.ReplaceAll(rest, "*", "worker-x") // JOBS.<any worker consumer>
				for _, subject := range []string{"$JS.API.CONSUMER.CREATE." + durable, "$JS.API.CONSUMER.CREATE." + durable + ".retry.>",
					"$JS.API.CONSUMER.MSG.NEXT." + durable} {
					require.True(t, denied(t, url, certs.CA, "operator", "pub", subject), "operator may publish %s", subject)
				}
				checked++
			}
		}
		require.GreaterOrEqual(t, checked, 12, "every service durable")
	})

	t.Run("operator pages a stream with retryd streams view, creating no consumer", func(t *testing.T) {
		retries, err := connect("admin").Stream(ctx, "RETRIES")
		require.NoError(t, err)
		consumers := func() []string {
			var names []string
			lister := retries.ConsumerNames(ctx)
			for n := range lister.Name() {
				names = append(names, n)
			}
			require.NoError(t, lister.Err())
			return names
		}
		before := consumers()
		operatorEnv(t, certs.CA)
		r := cli(t, "--timeout", "30s", "streams", "view", "RETRIES", "--subject", "retry.job.>", "--nats-url", url)
		require.Equal(t, exitOK, r.code, "stdout %q stderr %q", r.stdout, r.stderr)
		require.Contains(t, r.stdout, "] Subject: retry.job.failed.", "the job subtest's facts")
		require.Contains(t, r.stdout, "  Nats-Msg-Id: job-failed:")
		require.Contains(t, r.stdout, "  Retryd-Kind: job\n")
		require.Contains(t, r.stdout, `"specversion": "1.0"`)
		r = cli(t, "--timeout", "30s", "--json", "streams", "view", "RETRIES", "--last", "3", "--nats-url", url)
		require.Equal(t, exitOK, r.code, "stdout %q stderr %q", r.stdout, r.stderr)
		lines := strings.Split(strings.TrimSpace(r.stdout), "\n")
		require.Len(t, lines, 3)
		for _, l := range lines {
			var v viewedMsg
			require.NoError(t, json.Unmarshal([]byte(l), &v), l)
			require.True(t, strings.HasPrefix(v.Subject, "retry."), v.Subject)
			require.NotEmpty(t, v.Data, "a lifecycle fact's JSON")
		}
		require.ElementsMatch(t, before, consumers(), "the operator viewed RETRIES without a consumer")
	})

	t.Run("every durable consumer says what it is for", func(t *testing.T) {
		// Every component ran above: each durable it created is on the
		// server. runner is this test's, standing in for a workflow engine.
		admin := connect("admin")
		seen := 0
		for _, name := range streams.Names {
			s, err := admin.Stream(ctx, name)
			require.NoError(t, err)
			lister := s.ListConsumers(ctx)
			for info := range lister.Info() {
				if info.Config.Durable == "" || info.Name == "runner" {
					continue
				}
				seen++
				require.NotEmpty(t, info.Config.Description, "`nats consumer info %s %s` says what it is for", name, info.Name)
			}
			require.NoError(t, lister.Err())
		}
		require.GreaterOrEqual(t, seen, 12, "scheduler, jobs projection (2), ingress (3), triggers (5), worker")
	})

	t.Run("operator creates no consumer, and is told so", func(t *testing.T) {
		operatorRefusals(ctx, t, url, certs.CA, connect("admin"))
	})
}

// probePush is the push consumer of issue 41: on EVENTS, delivering to
// a subject RETRIES stores. Created, the messages it delivered would be
// stored in RETRIES as forged failures while anyone listened there.
const probePush = `{"stream_name":"EVENTS","config":{"durable_name":"probe-push","deliver_subject":"retry.job.failed.01FORGED0000000000000000000","filter_subject":"events.>","ack_policy":"none"}}`

// operatorRefusals checks that the operator creates no consumer, push,
// pull, durable or ordered, and that each refusal reads as one: the
// server's permissions violation, at once, not a request timing out.
func operatorRefusals(ctx context.Context, t *testing.T, url, ca string, admin jetstream.JetStream) {
	o := natsconn.Options{URL: url, Name: "test-operator", User: "operator", Password: password("operator"),
		TLSCA: ca, InboxPrefix: "_INBOX_operator"}
	nc, js, err := natsconn.Connect(ctx, o, zerolog.Nop())
	require.NoError(t, err)
	t.Cleanup(nc.Close)
	retries, err := admin.Stream(ctx, "RETRIES")
	require.NoError(t, err)
	before := retries.CachedInfo().State.Msgs
	// What activated the push consumer: the operator listening on its
	// deliver subject, which it may.
	_, err = nc.SubscribeSync("retry.job.failed.01FORGED0000000000000000000")
	require.NoError(t, err)
	require.NoError(t, nc.Flush())

	for name, create := range map[string]func(context.Context) error{
		"push consumer delivering into RETRIES": func(ctx context.Context) error {
			_, err := nc.RequestWithContext(ctx, "$JS.API.CONSUMER.CREATE.EVENTS.probe-push.events.>", []byte(probePush))
			return err
		},
		"the same, legacy ephemeral form": func(ctx context.Context) error {
			_, err := nc.RequestWithContext(ctx, "$JS.API.CONSUMER.CREATE.EVENTS", []byte(strings.Replace(probePush, `"durable_name"`, `"name"`, 1)))
			return err
		},
		"durable pull consumer": func(ctx context.Context) error {
			_, err := js.CreateConsumer(ctx, "RETRIES", jetstream.ConsumerConfig{Durable: "probe-durable", FilterSubject: "retry.job.>"})
			return err
		},
		"durable, legacy form": func(ctx context.Context) error {
			_, err := nc.RequestWithContext(ctx, "$JS.API.CONSUMER.DURABLE.CREATE.RETRIES.probe-durable", []byte(`{"stream_name":"RETRIES","config":{"durable_name":"probe-durable"}}`))
			return err
		},
		"ordered consumer (nats stream view)": func(ctx context.Context) error {
			s, err := js.Stream(ctx, "RETRIES")
			if err == nil {
				_, err = s.OrderedConsumer(ctx, jetstream.OrderedConsumerConfig{FilterSubjects: []string{"retry.job.>"}})
			}
			return err
		},
	} {
		rctx, stop := natsconn.WithRefusals(ctx, nc)
		err := natsconn.Refused(rctx, create(rctx))
		stop()
		require.ErrorIs(t, err, nats.ErrPermissionViolation, name)
		require.ErrorContains(t, err, "Permissions Violation for Publish to", name)
	}

	for stream, consumer := range map[string]string{"EVENTS": "probe-push", "RETRIES": "probe-durable"} {
		_, err := admin.Consumer(ctx, stream, consumer)
		require.ErrorIs(t, err, jetstream.ErrConsumerNotFound, "%s has no %s", stream, consumer)
	}
	retries, err = admin.Stream(ctx, "RETRIES")
	require.NoError(t, err)
	require.Equal(t, before, retries.CachedInfo().State.Msgs, "the operator stored nothing in RETRIES")

	// retryd's own commands say so too: the operator may list the
	// streams, not create them.
	operatorEnv(t, ca)
	r := cli(t, "--timeout", "30s", "streams", "list", "--nats-url", url)
	require.Equal(t, exitOK, r.code, "stdout %q stderr %q", r.stdout, r.stderr)
	require.Contains(t, r.stdout, "RETRIES")
	r = cli(t, "--timeout", "30s", "streams", "ensure", "--nats-url", url)
	require.NotEqual(t, exitOK, r.code)
	require.Contains(t, r.stderr, "Permissions Violation for Publish to", "a refusal, not a timeout")
	require.Contains(t, r.stderr, "$JS.API.STREAM.")
	require.NotContains(t, r.stderr, "deadline")
}

// operatorEnv connects the retryd commands as the operator user.
func operatorEnv(t *testing.T, ca string) {
	t.Setenv(natsconn.EnvUser, "operator")
	t.Setenv(natsconn.EnvPassword, password("operator"))
	t.Setenv(natsconn.EnvTLSCA, ca)
	t.Setenv(natsconn.EnvInboxPrefix, "_INBOX_operator")
	for _, env := range []string{natsconn.EnvCreds, natsconn.EnvNKey, natsconn.EnvToken, natsconn.EnvTLSCert, natsconn.EnvTLSKey} {
		t.Setenv(env, "")
	}
}

// denied reports whether the server refuses user's publish to or
// subscription on subject with a permissions violation. The server sends
// the violation before the answer to the flush's ping, and the client
// records it as it reads it, so LastError has it when Flush returns.
func denied(t *testing.T, url, ca, user, action, subject string) bool {
	t.Helper()
	nc, err := nats.Connect(url, nats.UserInfo(user, password(user)), nats.RootCAs(ca),
		nats.ErrorHandler(func(*nats.Conn, *nats.Subscription, error) {}))
	require.NoError(t, err)
	defer nc.Close()
	if action == "pub" {
		require.NoError(t, nc.Publish(subject, []byte("x")))
	} else {
		_, err := nc.SubscribeSync(subject)
		require.NoError(t, err)
	}
	require.NoError(t, nc.FlushTimeout(5*time.Second))
	return errors.Is(nc.LastError(), nats.ErrPermissionViolation)
}

func postJSON(t *testing.T, url, body string) {
	t.Helper()
	resp, err := http.Post(url, "application/json", strings.NewReader(body))
	require.NoError(t, err)
	defer resp.Body.Close()
	require.Less(t, resp.StatusCode, 300, "POST %s", url)
}
