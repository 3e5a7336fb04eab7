package e2e_test

import (
	"bufio"
	"bytes"
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"github.com/retryd/retryd/internal/servicetest"
	"os"
	"os/exec"
	"path/filepath"
	"strconv"
	"strings"
	"sync"
	"syscall"
	"testing"
	"time"

	"github.com/nats-io/nats.go"
	"github.com/nats-io/nats.go/jetstream"
	"github.com/stretchr/testify/require"

	"github.com/retryd/retryd/pkg/contract"
	"github.com/retryd/retryd/services/jobs"
	"github.com/retryd/retryd/stores/jobstore"
)

// workerTSDir is the TypeScript example: plain JavaScript with JSDoc
// types, run by node without a build step (Node 18, Debian 12's, and up).
const workerTSDir = "../worker-ts"

// TestTypeScriptWorker runs examples/worker-ts, a worker written from the
// documented wire protocol with the NATS JavaScript client, as a node
// child process against the embedded stack (scheduler, jobs projection
// and API; no Go worker, so the TypeScript worker routes the dues too):
//   - a job that fails with network on attempt 1 resumes on attempt 2
//     from the checkpoint attempt 1 wrote, and completes;
//   - a job that fails with validation is not retried (failed,
//     non_retryable);
//   - a job submitted by the example's enqueue script on the high band
//     completes;
//   - what the worker published decodes with pkg/contract's strict
//     decoders, headers included;
//   - a malformed job message is terminated, not run;
//   - SIGTERM drains: the running job finishes and reports, and node
//     exits 0.
//
// Before the stack starts, the example's own unit tests (node --test) and
// its type check (tsc over the JSDoc types) run in the same copy.
func TestTypeScriptWorker(t *testing.T) {
	t.Parallel()
	dir := npmInstall(t)
	// The protocol's unit tests, and the types: tsc checks the JSDoc
	// types of every file (npm run typecheck).
	for _, args := range [][]string{{"node", "--test", "protocol.test.mjs"}, {"npm", "run", "-s", "typecheck"}} {
		cmd := exec.Command(args[0], args[1:]...)
		cmd.Dir = dir
		out, err := cmd.CombinedOutput()
		require.NoError(t, err, "%s:\n%s", strings.Join(args, " "), out)
	}
	e := setup(t)
	w := startNode(t, dir, "main.mjs", map[string]string{
		"NATS_URL":        e.srv.ClientURL(),
		"WORKER_SOURCE":   "worker-ts-e2e",
		"WORKER_EXECUTOR": "ts-e2e-1",
	})
	w.waitFor(t, "worker ready", func(l logLine) bool { return l.Msg == "ready" })

	resume := e.enqueue(t, contract.JobData{JobType: "onboarding_ts", Payload: json.RawMessage(`{"user":"ada","fail_at":"send_welcome"}`)})
	invalid := e.enqueue(t, contract.JobData{JobType: "enrich_ts", Payload: json.RawMessage(`{"domain":"localhost"}`)})
	high := enqueueTS(t, dir, e.srv.ClientURL(), "enrich_ts", `{"domain":"example.com"}`, "high")

	// Network failure, then a resume from the checkpoint.
	e.waitJob(t, resume, jobstore.StatusCompleted)
	e.waitJob(t, invalid, jobstore.StatusFailed)
	e.waitJob(t, high, jobstore.StatusCompleted)
	e.projected(t)

	// The job's status comes from the jobs projection, its history from
	// the scheduler, which may apply the success a moment later.
	var detail jobs.JobDetail
	require.Eventually(t, func() bool {
		detail = jobs.JobDetail{}
		require.Equal(t, 200, e.call(t, "GET", "/v1/jobs/"+resume, nil, &detail))
		return len(detail.History) >= 4
	}, 30*time.Second, 50*time.Millisecond, "the scheduler records the success")
	j := detail.Job
	require.Equal(t, jobstore.StatusCompleted, j.Status)
	require.Equal(t, 2, j.Attempt)
	require.Equal(t, 1, j.RetryCount)
	require.Equal(t, "network", j.LastErrorClass)
	require.Equal(t, "send_welcome: connection reset by peer", j.LastErrorMessage)
	require.Equal(t, []string{"failed", "scheduled", "due", "succeeded"}, events(detail.History))
	require.Equal(t, "network", detail.History[0].ErrorClass)
	require.Equal(t, "ts-e2e-1", detail.History[0].Executor, "the worker names itself on failed")
	require.Equal(t, "ts-e2e-1", detail.History[3].Executor, "and on succeeded")

	// What the worker saw and did, from its log: attempt 1 ran
	// create_account and failed at send_welcome with the checkpoint of
	// create_account; attempt 2 read that checkpoint back and ran the
	// two steps left, not create_account again.
	cp := `{"step":"create_account"}`
	attempts := w.lines(func(l logLine) bool { return l.Msg == "attempt" && l.ID == resume })
	require.Len(t, attempts, 2)
	require.Equal(t, 1, attempts[0].Attempt)
	require.JSONEq(t, `null`, string(attempts[0].Checkpoint))
	require.Equal(t, 2, attempts[1].Attempt)
	require.JSONEq(t, cp, string(attempts[1].Checkpoint), "attempt 2 resumes from the checkpoint attempt 1 wrote")
	outcomes := w.lines(func(l logLine) bool { return l.Msg == "outcome" && l.ID == resume })
	require.Len(t, outcomes, 2)
	require.Equal(t, "failed", outcomes[0].Outcome)
	require.Equal(t, "network", outcomes[0].Class)
	require.JSONEq(t, cp, string(outcomes[0].Checkpoint), "attempt 1 reported this checkpoint")
	require.Equal(t, "succeeded", outcomes[1].Outcome)
	var steps []string
	for _, l := range w.lines(func(l logLine) bool { return l.Msg == "step" && l.ID == resume }) {
		steps = append(steps, strconv.Itoa(l.Attempt)+":"+l.Step)
	}
	require.Equal(t, []string{"1:create_account", "2:send_welcome", "2:schedule_followup"}, steps)

	// On the wire: the failed fact, its due routed as a job by the
	// TypeScript router, and the success, each as pkg/contract decodes it.
	failed := lastMsg(t, e, contract.StreamRetries, "retry.job.failed."+resume)
	lc, err := contract.DecodeLifecycle(failed.Subject, failed.Data)
	require.NoError(t, err)
	require.NoError(t, contract.CheckLifecycleHeaders(failed.Header, lc))
	require.Equal(t, "job-failed:"+resume+":1", failed.Header.Get(contract.HeaderMsgID))
	require.Equal(t, map[string]string{"Retryd-Kind": "job", "Retryd-Item-Id": resume, "Retryd-Attempt": "1", "Retryd-Event": "failed", "Content-Type": "application/json"},
		map[string]string{"Retryd-Kind": failed.Header.Get("Retryd-Kind"), "Retryd-Item-Id": failed.Header.Get("Retryd-Item-Id"),
			"Retryd-Attempt": failed.Header.Get("Retryd-Attempt"), "Retryd-Event": failed.Header.Get("Retryd-Event"), "Content-Type": failed.Header.Get("Content-Type")})
	require.Equal(t, "worker-ts-e2e", lc.Envelope.Source)
	require.Equal(t, "job/"+resume, lc.Envelope.Subject)
	f := lc.Failed
	require.Equal(t, "network", f.Error.Class)
	require.Equal(t, "onboarding_ts", f.JobType)
	require.JSONEq(t, cp, string(f.Checkpoint))
	require.JSONEq(t, `{"user":"ada","fail_at":"send_welcome"}`, string(f.Payload))
	require.Equal(t, "ts-e2e-1", f.Executor)

	routed := lastMsg(t, e, contract.StreamJobs, "jobs.onboarding_ts")
	jobEnv, job, err := contract.DecodeJob(routed.Subject, routed.Data)
	require.NoError(t, err)
	require.Equal(t, "job-retry:"+resume+":2", routed.Header.Get(contract.HeaderMsgID), "a routed due keeps the due's id")
	require.Equal(t, routed.Header.Get(contract.HeaderMsgID), jobEnv.ID)
	require.Equal(t, "worker-ts-e2e", jobEnv.Source, "the TypeScript worker routed it")
	require.Equal(t, 2, job.Attempt)
	require.JSONEq(t, cp, string(job.Checkpoint))

	succeeded := lastMsg(t, e, contract.StreamRetries, "retry.job.succeeded."+resume)
	lc, err = contract.DecodeLifecycle(succeeded.Subject, succeeded.Data)
	require.NoError(t, err)
	require.NoError(t, contract.CheckLifecycleHeaders(succeeded.Header, lc))
	require.Equal(t, "job-succeeded:"+resume+":2", succeeded.Header.Get(contract.HeaderMsgID))

	// Validation: final after attempt 1 (again, the history may come a
	// moment after the status).
	require.Eventually(t, func() bool {
		detail = jobs.JobDetail{}
		require.Equal(t, 200, e.call(t, "GET", "/v1/jobs/"+invalid, nil, &detail))
		return len(detail.History) >= 2 && detail.Job.StatusReason != ""
	}, 30*time.Second, 50*time.Millisecond, "the scheduler records the exhaustion")
	require.Equal(t, jobstore.StatusFailed, detail.Job.Status)
	require.Equal(t, "non_retryable", detail.Job.StatusReason)
	require.Equal(t, "validation", detail.Job.LastErrorClass)
	require.Equal(t, 1, detail.Job.Attempt)
	require.Equal(t, 0, detail.Job.RetryCount)
	require.Equal(t, []string{"failed", "exhausted"}, events(detail.History))
	require.Len(t, w.lines(func(l logLine) bool { return l.Msg == "attempt" && l.ID == invalid }), 1, "never retried")

	// The high band: enqueued by the example's script, run from
	// worker-enrich_ts=high.
	var list struct{ Jobs []jobstore.Job }
	require.Equal(t, 200, e.call(t, "GET", "/v1/jobs?job_type=enrich_ts&priority=high", nil, &list))
	require.Len(t, list.Jobs, 1)
	require.Equal(t, high, list.Jobs[0].ID)
	require.Equal(t, jobstore.StatusCompleted, list.Jobs[0].Status)

	// A job message with an unknown field is terminated, never run.
	bad := nats.NewMsg("jobs.enrich_ts")
	bad.Header.Set(contract.HeaderMsgID, "job:typo:1")
	bad.Data = []byte(`{"specversion":"1.0","id":"job:typo:1","source":"e2e","type":"job.requested","time":"2025-03-14T15:09:26Z",` +
		`"datacontenttype":"application/json","data":{"id":"typo","job_type":"enrich_ts","attempt":1,"atempt":2}}`)
	_, err = e.js.PublishMsg(e.ctx, bad)
	require.NoError(t, err)
	w.waitFor(t, "the malformed job terminated", func(l logLine) bool { return l.Msg == "malformed job terminated" })
	require.Contains(t, w.lines(func(l logLine) bool { return l.Msg == "malformed job terminated" })[0].Error, "data.atempt")
	require.Empty(t, w.lines(func(l logLine) bool { return l.Msg == "attempt" && l.ID == "typo" }))

	// SIGTERM while a job runs: it finishes and reports, node exits 0.
	slow := e.enqueue(t, contract.JobData{JobType: "onboarding_ts", Payload: json.RawMessage(`{"user":"bo","step_ms":300}`)})
	w.waitFor(t, "slow job started", func(l logLine) bool { return l.Msg == "attempt" && l.ID == slow })
	require.NoError(t, w.cmd.Process.Signal(syscall.SIGTERM))
	select {
	case <-w.exited:
	case <-time.After(wait):
		t.Fatal("node did not exit within 30s of SIGTERM")
	}
	require.Equal(t, 0, w.cmd.ProcessState.ExitCode(), "exit code after SIGTERM")
	require.Len(t, w.lines(func(l logLine) bool { return l.Msg == "outcome" && l.ID == slow && l.Outcome == "succeeded" }), 1, "the running job reported before the exit")
	require.Len(t, w.lines(func(l logLine) bool { return l.Msg == "stopped" }), 1)
	e.waitJob(t, slow, jobstore.StatusCompleted)
}

// npmInstall copies the example (sources, package.json, lock, tsconfig) to a
// temp dir and runs `npm ci` there, so the repository gets no
// node_modules. Without node or npm it skips, unless CI is set.
func npmInstall(t *testing.T) string {
	t.Helper()
	for _, tool := range []string{"node", "npm"} {
		_, err := exec.LookPath(tool)
		servicetest.NeedTool(t, err == nil, tool, "apt-get install nodejs npm (Node 18 or later)")
	}
	out, err := exec.Command("node", "--version").Output()
	require.NoError(t, err)
	major, _, _ := strings.Cut(strings.TrimPrefix(strings.TrimSpace(string(out)), "v"), ".")
	n, err := strconv.Atoi(major)
	servicetest.NeedTool(t, err == nil && n >= 18, "node 18 or later (found "+strings.TrimSpace(string(out))+")", "install Node 18 or later")

	dir := t.TempDir()
	files, err := filepath.Glob(filepath.Join(workerTSDir, "*.mjs"))
	require.NoError(t, err)
	require.NotEmpty(t, files)
	for _, f := range append(files, filepath.Join(workerTSDir, "package.json"), filepath.Join(workerTSDir, "package-lock.json"),
		filepath.Join(workerTSDir, "tsconfig.json")) {
		b, err := os.ReadFile(f)
		require.NoError(t, err)
		require.NoError(t, os.WriteFile(filepath.Join(dir, filepath.Base(f)), b, 0o644))
	}
	ctx, cancel := context.WithTimeout(context.Background(), 5*time.Minute)
	defer cancel()
	cmd := exec.CommandContext(ctx, "npm", "ci", "--no-audit", "--no-fund", "--loglevel=error")
	cmd.Dir = dir
	out, err = cmd.CombinedOutput()
	require.NoError(t, err, "npm ci in a copy of %s:\n%s", workerTSDir, out)
	return dir
}

// logLine is a line of the worker's JSON log, the fields the test reads.
type logLine struct {
	Msg        string          `json:"msg"`
	ID         string          `json:"id"`
	Attempt    int             `json:"attempt"`
	Step       string          `json:"step"`
	Outcome    string          `json:"outcome"`
	Class      string          `json:"class"`
	Checkpoint json.RawMessage `json:"checkpoint"`
	Error      string          `json:"error"`
}

// nodeProc is a node child process and the lines of its log.
type nodeProc struct {
	cmd    *exec.Cmd
	exited chan struct{}
	mu     sync.Mutex
	log    []logLine
	raw    []string
	stderr bytes.Buffer
}

// startNode runs `node script` in dir with env added; it is killed (if
// still running) in t.Cleanup, and its output is logged if the test
// failed (or E2E_LOG is set).
func startNode(t *testing.T, dir, script string, env map[string]string) *nodeProc {
	t.Helper()
	p := &nodeProc{exited: make(chan struct{})}
	p.cmd = exec.Command("node", script)
	p.cmd.Dir = dir
	p.cmd.Env = os.Environ()
	for k, v := range env {
		p.cmd.Env = append(p.cmd.Env, k+"="+v)
	}
	stdout, err := p.cmd.StdoutPipe()
	require.NoError(t, err)
	p.cmd.Stderr = &lockedWriter{mu: &p.mu, w: &p.stderr}
	require.NoError(t, p.cmd.Start())
	readDone := make(chan struct{})
	go func() {
		defer close(readDone)
		sc := bufio.NewScanner(stdout)
		sc.Buffer(make([]byte, 64<<10), 4<<20)
		for sc.Scan() {
			var l logLine
			_ = json.Unmarshal(sc.Bytes(), &l)
			p.mu.Lock()
			p.log = append(p.log, l)
			p.raw = append(p.raw, sc.Text())
			p.mu.Unlock()
		}
	}()
	go func() {
		<-readDone
		_ = p.cmd.Wait()
		close(p.exited)
	}()
	t.Cleanup(func() {
		select {
		case <-p.exited:
		default:
			_ = p.cmd.Process.Kill()
			<-p.exited
		}
		if t.Failed() || os.Getenv("E2E_LOG") != "" {
			p.mu.Lock()
			defer p.mu.Unlock()
			t.Logf("node %s stdout:\n%s\nstderr:\n%s", script, strings.Join(p.raw, "\n"), p.stderr.String())
		}
	})
	return p
}

func (p *nodeProc) lines(match func(logLine) bool) []logLine {
	p.mu.Lock()
	defer p.mu.Unlock()
	var out []logLine
	for _, l := range p.log {
		if match(l) {
			out = append(out, l)
		}
	}
	return out
}

// waitFor polls the log until a line matches; node exiting first fails
// the test.
func (p *nodeProc) waitFor(t *testing.T, what string, match func(logLine) bool) {
	t.Helper()
	require.Eventually(t, func() bool {
		select {
		case <-p.exited:
			return true
		default:
			return len(p.lines(match)) > 0
		}
	}, wait, 20*time.Millisecond, "waiting for: %s", what)
	require.NotEmpty(t, p.lines(match), "node exited while waiting for: %s; stderr: %s", what, p.stderrString())
}

func (p *nodeProc) stderrString() string {
	p.mu.Lock()
	defer p.mu.Unlock()
	return p.stderr.String()
}

type lockedWriter struct {
	mu *sync.Mutex
	w  *bytes.Buffer
}

func (l *lockedWriter) Write(b []byte) (int, error) {
	l.mu.Lock()
	defer l.mu.Unlock()
	return l.w.Write(b)
}

// enqueueTS submits a job with the example's enqueue script and returns
// its id.
func enqueueTS(t *testing.T, dir, natsURL, jobType, payload, priority string) string {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), wait)
	defer cancel()
	cmd := exec.CommandContext(ctx, "node", "enqueue.mjs", jobType, payload, "1", priority)
	cmd.Dir = dir
	cmd.Env = append(os.Environ(), "NATS_URL="+natsURL)
	var stderr bytes.Buffer
	cmd.Stderr = &stderr
	out, err := cmd.Output()
	require.NoError(t, err, "enqueue.mjs: %s", stderr.String())
	id := strings.TrimSpace(string(out))
	require.NoError(t, contract.ValidateID("id", id))
	return id
}

// lastMsg reads the last message of subject on stream.
func lastMsg(t *testing.T, e *env, stream, subject string) *jetstream.RawStreamMsg {
	t.Helper()
	s, err := e.js.Stream(e.ctx, stream)
	require.NoError(t, err)
	m, err := s.GetLastMsgForSubject(e.ctx, subject)
	if errors.Is(err, jetstream.ErrMsgNotFound) {
		require.FailNow(t, fmt.Sprintf("no message on %s in %s", subject, stream))
	}
	require.NoError(t, err)
	return m
}
