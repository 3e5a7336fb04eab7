package main

import (
	"context"
	"encoding/json"
	"fmt"
	"github.com/retryd/retryd/internal/servicetest"
	"os"
	"os/exec"
	"path/filepath"
	"strconv"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/chromedp/chromedp"
	"github.com/chromedp/chromedp/kb"
	"github.com/stretchr/testify/require"

	"github.com/retryd/retryd/pkg/contract"
	"github.com/retryd/retryd/pkg/errclass"
	"github.com/retryd/retryd/pkg/policy"
	"github.com/retryd/retryd/pkg/worker"
)

// chromiumPath finds the browser: $CHROMIUM, else Debian's chromium.
func chromiumPath() string {
	if p := os.Getenv("CHROMIUM"); p != "" {
		return p
	}
	for _, name := range []string{"/usr/bin/chromium", "chromium", "chromium-browser", "google-chrome"} {
		if p, err := exec.LookPath(name); err == nil {
			return p
		}
	}
	return ""
}

// browser starts headless Chromium with a throwaway profile, and opts
// (flags of a test's own).
func browser(t *testing.T, opts ...chromedp.ExecAllocatorOption) context.Context {
	t.Helper()
	path := chromiumPath()
	servicetest.NeedTool(t, path != "", "chromium", "apt-get install chromium (or set CHROMIUM)")
	allocCtx, cancelAlloc := chromedp.NewExecAllocator(context.Background(), append([]chromedp.ExecAllocatorOption{
		chromedp.ExecPath(path),
		chromedp.Headless,
		chromedp.NoSandbox,
		chromedp.DisableGPU,
		chromedp.NoFirstRun,
		chromedp.Flag("disable-background-networking", true),
		chromedp.Flag("disable-component-update", true),
		chromedp.Flag("disable-sync", true),
		chromedp.Flag("disable-dev-shm-usage", true),
		chromedp.UserDataDir(t.TempDir()),
		chromedp.WindowSize(1500, 1000),
	}, opts...)...)
	t.Cleanup(cancelAlloc)
	ctx, cancel := chromedp.NewContext(allocCtx)
	t.Cleanup(cancel)
	ctx, cancelTimeout := context.WithTimeout(ctx, 2*time.Minute)
	t.Cleanup(cancelTimeout)
	return ctx
}

// pageErrors collects the page's uncaught exceptions and console errors.
type pageErrors struct {
	mu   sync.Mutex
	msgs []string
	// allowed are URL parts whose 400 answers the test provokes on
	// purpose (Chromium logs every failed request as a console error).
	allowed []string
}

// allow400 accepts the console error of a 400 answer from a URL
// containing part: a validation error the test asks for.
func (pe *pageErrors) allow400(part string) {
	pe.mu.Lock()
	defer pe.mu.Unlock()
	pe.allowed = append(pe.allowed, part)
}

func (pe *pageErrors) expected(m chromedp.ConsoleMessage) bool {
	if m.Source != "network" || !strings.Contains(m.Text, "status of 400") {
		return false
	}
	for _, part := range pe.allowed {
		if strings.Contains(m.URL, part) {
			return true
		}
	}
	return false
}

func watchConsole(ctx context.Context) *pageErrors {
	pe := &pageErrors{}
	messages := chromedp.Console(ctx)
	go func() {
		for m, err := range messages {
			if err != nil {
				return
			}
			if m.IsException() || m.Type == chromedp.ConsoleError {
				pe.mu.Lock()
				if !pe.expected(m) {
					pe.msgs = append(pe.msgs, m.String()+" "+m.URL)
				}
				pe.mu.Unlock()
			}
		}
	}()
	return pe
}

func (pe *pageErrors) list() []string {
	pe.mu.Lock()
	defer pe.mu.Unlock()
	return append([]string(nil), pe.msgs...)
}

// poll waits until the JavaScript expression is truthy.
func poll(expr string) chromedp.Action[chromedp.Void] {
	return chromedp.Poll[chromedp.Void](expr, chromedp.WithPollingTimeout(20*time.Second), chromedp.WithPollingInterval(50*time.Millisecond))
}

func eval[T any](t *testing.T, ctx context.Context, expr string) T {
	t.Helper()
	v, err := chromedp.Run(ctx, chromedp.Evaluate[T](expr))
	require.NoError(t, err, expr)
	return v
}

// shot saves a screenshot when RETRYD_SCREENSHOT_DIR is set.
func shot(t *testing.T, ctx context.Context, name string) {
	dir := os.Getenv("RETRYD_SCREENSHOT_DIR")
	if dir == "" {
		return
	}
	png, err := chromedp.Run(ctx, chromedp.FullScreenshot(100)) // quality 100: PNG
	require.NoError(t, err)
	require.NoError(t, os.WriteFile(filepath.Join(dir, name+".png"), png, 0o644))
}

// text is the visible text of the first element matching a CSS selector.
func text(t *testing.T, ctx context.Context, selector string) string {
	t.Helper()
	return eval[string](t, ctx, fmt.Sprintf(`document.querySelector(%q)?.innerText ?? ""`, selector))
}

// TestDashboardBrowser drives the dashboard in headless Chromium: load it,
// filter, open an item's timeline, cancel it and see its state change; the
// timelines of a held, a released and a hold_expired item; then the
// analytics, a source's pause and a policy edit, with a backoff per error
// class and a validation error.
func TestDashboardBrowser(t *testing.T) {
	t.Parallel()
	ctx := browser(t)
	b := setup(t, map[string]worker.Handler{
		"dash_flaky": func(_ context.Context, j *worker.Job) error {
			if j.Attempt == 1 {
				return errclass.New(errclass.Timeout, "smtp: timed out after 5s")
			}
			return nil
		},
	})
	for _, jt := range []string{"dash_email", "dash_crm"} {
		b.ok(t, "policies", "set", "job", jt, "--max-retries", "4", "--base-delay", "1h", "--max-delay", "4h")
	}
	b.ok(t, "policies", "set", "job", "dash_flaky", "--max-retries", "2", "--base-delay", "10ms", "--max-delay", "20ms")
	b.ok(t, "policies", "set", "job", "dash_hold", "--max-retries", "3", "--base-delay", "1h", "--max-delay", "4h")
	// A hold of one second: a hold without a release time is looked at
	// again after it, and held again it has expired.
	b.ok(t, "policies", "set", "job", "dash_expire", "--max-retries", "3", "--base-delay", "1h", "--max-delay", "4h", "--max-hold", "1s")
	email1, email2, crm := contract.NewID(), contract.NewID(), contract.NewID()
	b.fail(t, email1, "dash_email", 1, "timeout", "smtp: timed out after 5s")
	b.fail(t, email2, "dash_email", 1, "network", "dial tcp 10.0.0.7:587: connection refused")
	b.fail(t, crm, "dash_crm", 1, "rate_limit", "crm: 429 too many requests")
	for _, id := range []string{email1, email2} {
		b.waitRetry(t, "job", id, "scheduled")
	}
	b.waitRetry(t, "job", crm, "scheduled")
	for range 3 {
		_, err := worker.Enqueue(b.ctx, b.stack.JS, contract.JobData{JobType: "dash_flaky"})
		require.NoError(t, err)
	}
	b.ok(t, "sources", "set", "dash_source", "--rate-limit", "10", "--window", "1s")

	errs := watchConsole(ctx)
	row := func(id string) string { return fmt.Sprintf(`tr[data-id=%q]`, id) }

	t.Log("load: pending retries are listed")
	require.NoError(t, chromedp.Do(ctx,
		chromedp.Navigate(b.api+"/ui/"),
		chromedp.WaitVisible(chromedp.CSS(row(email1))),
		chromedp.WaitVisible(chromedp.CSS(row(crm))),
		poll(`document.querySelector('.chip[data-state="scheduled"] b')?.textContent === "3"`),
	))
	require.Equal(t, "scheduled", eval[string](t, ctx, `document.querySelector('select[data-test="filter-state"]').value`))

	t.Log("at 1400 px the top bar keeps its counters on one line")
	// With counts of a busy deployment (compact: 12.3K, 4.5M), a long
	// token name with its sign-out button, and "updated 59s ago". The live
	// refresh is off meanwhile, so that nothing redraws them.
	require.NoError(t, chromedp.Do(ctx, chromedp.EmulateViewport(1400, 900)))
	bar := eval[string](t, ctx, `(() => {
		document.getElementById("autorefresh").checked = false;
		const saved = ["whoami", "updated"].map((id) => document.getElementById(id).textContent);
		const shown = [...document.querySelectorAll("#summary .chip b")];
		const savedCounts = shown.map((b) => b.textContent);
		const counts = ["12.3K", "345", "1.2K", "4.5M", "67"];
		shown.forEach((b, i) => { b.textContent = counts[i]; });
		document.getElementById("account").hidden = false;
		document.getElementById("whoami").textContent = "ci-deploy-operator-with-a-long-token-name-of-sixty-four-letters (operator)";
		document.getElementById("signout").hidden = false;
		document.getElementById("updated").textContent = "updated 59s ago";
		const bar = document.querySelector(".topbar").getBoundingClientRect();
		const chips = [...document.querySelectorAll("#summary .chip")].map((c) => c.getBoundingClientRect());
		const out = [];
		if (chips.length !== 5) out.push(chips.length + " counters, want 5");
		if (new Set(chips.map((c) => c.top)).size > 1) out.push("the counters are on several lines: tops " + chips.map((c) => c.top).join(", "));
		for (const c of chips) if (c.top < bar.top || c.bottom > bar.bottom) out.push("a counter leaves the bar: " + c.top + "-" + c.bottom + " outside " + bar.top + "-" + bar.bottom);
		const el = document.querySelector(".topbar");
		if (el.scrollWidth > el.clientWidth) out.push("the bar overflows: " + el.scrollWidth + " > " + el.clientWidth);
		if (document.documentElement.scrollWidth > innerWidth) out.push("the page scrolls sideways: " + document.documentElement.scrollWidth + " > " + innerWidth);
		["whoami", "updated"].forEach((id, i) => { document.getElementById(id).textContent = saved[i]; });
		shown.forEach((b, i) => { b.textContent = savedCounts[i]; });
		document.getElementById("signout").hidden = true;
		document.getElementById("autorefresh").checked = true;
		return out.join("; ");
	})()`)
	require.Empty(t, bar)
	require.NoError(t, chromedp.Do(ctx, chromedp.EmulateViewport(1500, 1000)))

	t.Log("filter by job type")
	require.NoError(t, chromedp.Do(ctx,
		chromedp.SendKeys(chromedp.CSS(`input[data-test="filter-job_type"]`), "dash_crm"+kb.Enter),
		poll(fmt.Sprintf(`(() => { const ids = [...document.querySelectorAll("tbody tr[data-id]")].map(r => r.dataset.id);
			return ids.length === 1 && ids[0] === %q })()`, crm)),
	))
	require.Contains(t, eval[string](t, ctx, `location.hash`), "job_type=dash_crm")

	t.Log("open the timeline")
	require.NoError(t, chromedp.Do(ctx,
		clickLive(row(crm)),
		chromedp.WaitVisible(chromedp.CSS(`[data-test="timeline"] li[data-event="scheduled"]`)),
	))
	timeline := eval[string](t, ctx, `document.querySelector('[data-test="timeline"]').innerText`)
	require.Contains(t, timeline, "Attempt 1 failed")
	require.Contains(t, timeline, "crm: 429 too many requests")
	require.Contains(t, timeline, "decided by backoff")
	require.Contains(t, timeline, "policy job-dash_crm v1")
	why := eval[string](t, ctx, `document.querySelector('[data-test="why"]').innerText`)
	require.Contains(t, why, "rate_limit")
	require.Contains(t, why, "allows 4 retries")
	shot(t, ctx, "timeline")

	t.Log("with the detail open, the list stays inside its panel")
	// 1150 px is just above the width where the detail moves below the
	// list: the narrowest list column the layout allows.
	for _, width := range []int64{1500, 1150} {
		require.NoError(t, chromedp.Do(ctx, chromedp.EmulateViewport(width, 1000)))
		overflow := eval[string](t, ctx, `(() => {
			const list = document.querySelector(".split > .panel:not(.detail)");
			const detail = document.querySelector('[data-test="detail"]');
			const l = list.getBoundingClientRect(), d = detail.getBoundingClientRect();
			const t = list.querySelector("table").getBoundingClientRect();
			const out = [];
			if (list.scrollWidth > list.clientWidth) out.push("the list panel overflows: " + list.scrollWidth + " > " + list.clientWidth);
			if (l.right > d.left) out.push("the list panel runs under the detail: " + l.right + " > " + d.left);
			const frame = list.querySelector(".table-wrap");
			if (!frame) return out.concat("the table has no .table-wrap frame").join("; ");
			const w = frame.getBoundingClientRect();
			if (w.right > l.right + 0.5) out.push("the table's frame leaves the panel: " + w.right + " > " + l.right);
			if (t.width > w.width + 0.5 && getComputedStyle(frame).overflowX !== "auto") out.push("a wide table does not scroll");
			return out.join("; ");
		})()`)
		require.Empty(t, overflow, "viewport %d px wide", width)
	}
	require.NoError(t, chromedp.Do(ctx, chromedp.EmulateViewport(1500, 1000)))

	t.Log("cancel it and see the state change")
	require.NoError(t, chromedp.Do(ctx,
		clickLive(`[data-test="detail"] [data-test="cancel"]`),
		giveReason("duplicate contact"),
		poll(`document.querySelector('[data-test="detail-state"]')?.dataset.state === "cancelled"`),
		chromedp.WaitVisible(chromedp.CSS(`[data-test="timeline"] li[data-event="cancelled"]`)),
		// Cancelled, it leaves the list of pending retries.
		poll(fmt.Sprintf(`document.querySelector(%q) === null`, row(crm))),
	))
	require.Contains(t, eval[string](t, ctx, `document.querySelector('[data-test="timeline"] li[data-event="cancelled"]').innerText`), "duplicate contact")
	v := b.waitRetry(t, "job", crm, "cancelled")
	var detail map[string]string
	require.NoError(t, json.Unmarshal(v.History[len(v.History)-1].Detail, &detail))
	require.Equal(t, map[string]string{"by": "local", "reason": "duplicate contact"}, detail, "the principal (authentication off in dev: local)")

	openItem := func(id string) {
		t.Helper()
		require.NoError(t, chromedp.Do(ctx,
			chromedp.Navigate(b.api+"/ui/#/retries?state=any&item=job/"+id),
			poll(fmt.Sprintf(`document.querySelector('[data-test="detail"] h2')?.textContent === %q`, "job / "+id)),
		))
	}

	t.Log("a held item explains its hold and spends no retry")
	heldID := contract.NewID()
	until := time.Now().Add(2 * time.Hour).UTC()
	b.held(t, contract.HeldData{Kind: contract.KindJob, ID: heldID, Attempt: 1, JobType: "dash_hold", Reason: contract.HoldPause,
		Until: &until, HoldKey: "dash_partner", Detail: "source_paused: source is paused until 2h from now", Executor: "dash-worker-1"})
	b.waitRetry(t, "job", heldID, "scheduled")
	openItem(heldID)
	require.NoError(t, chromedp.Do(ctx,
		chromedp.WaitVisible(chromedp.CSS(`[data-test="timeline"] li[data-event="held"]`)),
		chromedp.WaitVisible(chromedp.CSS(`[data-test="timeline"] li[data-decided-by="pause_until"]`)),
	))
	heldEvent := text(t, ctx, `[data-test="timeline"] li[data-event="held"]`)
	require.Contains(t, heldEvent, "Attempt 1 held back (pause)")
	require.Contains(t, heldEvent, "hold key dash_partner")
	require.Contains(t, heldEvent, "source_paused: source is paused")
	require.Contains(t, heldEvent, "executor dash-worker-1", "the instance that held the attempt")
	decision := text(t, ctx, `[data-test="timeline"] li[data-decided-by="pause_until"]`)
	require.Contains(t, decision, "Held back by its owner: paused until")
	require.Contains(t, decision, "no retry spent (0 of 3 used)")
	require.Contains(t, decision, "max hold 30d")
	require.NotContains(t, decision, "retry 0 of 3")
	why = text(t, ctx, `[data-test="why"]`)
	require.Contains(t, why, "Attempt 1 was held back by its owner: paused until")
	require.Contains(t, why, "no retry spent")
	require.Contains(t, why, "allows 3 retries (0 used so far)")
	require.NotContains(t, why, "chose a delay")
	require.Contains(t, text(t, ctx, `[data-test="detail"] dl`), "pause since")
	require.Equal(t, "held", text(t, ctx, `[data-test="detail-state"] .badge`))
	require.Regexp(t, `Hold ends\s+\S+ \S+ \(in (2h|1h59m)`, text(t, ctx, `[data-test="detail"] dl`), "a pause with an end ends then")

	t.Log("the list shows held items as held, not as failures")
	waitingID := contract.NewID()
	b.held(t, contract.HeldData{Kind: contract.KindJob, ID: waitingID, Attempt: 1, JobType: "dash_hold", Reason: contract.HoldPause,
		HoldKey: "dash_waiting", Detail: "source_paused: source is paused"})
	b.waitRetry(t, "job", waitingID, "scheduled")
	require.NoError(t, chromedp.Do(ctx,
		chromedp.Navigate(b.api+"/ui/#/retries?job_type=dash_hold&item=job/"+waitingID),
		chromedp.WaitVisible(chromedp.CSS(row(waitingID)+` [data-test="row-hold"]`)),
		chromedp.WaitVisible(chromedp.CSS(row(heldID))),
		poll(`document.querySelector('[data-test="detail-state"]')?.dataset.held === "pause"`),
	))
	for _, id := range []string{waitingID, heldID} {
		require.Equal(t, "held", text(t, ctx, row(id)+` .badge`), "a held badge, not scheduled")
		require.Equal(t, "pause", eval[string](t, ctx, fmt.Sprintf(`document.querySelector(%q).dataset.held`, row(id))))
		require.Zero(t, eval[int](t, ctx, fmt.Sprintf(`document.querySelectorAll(%q).length`, row(id)+` .err, `+row(id)+` .cls`)),
			"no error styling on a held row")
		require.Equal(t, "rgb(21, 94, 117)", eval[string](t, ctx, fmt.Sprintf(`getComputedStyle(document.querySelector(%q)).color`, row(id)+` [data-test="row-hold"] span`)),
			"the hold reads as information, not in an error's red")
	}
	require.Regexp(t, `^pause · key dash_waiting · held \d`, text(t, ctx, row(waitingID)+` [data-test="row-hold"]`))
	require.Regexp(t, `^until released \(at most (30d|29d23h)\)$`, text(t, ctx, row(waitingID)+` [data-test="row-next"]`),
		"a pause without an end waits for a release, not for an attempt in 30d")
	require.Regexp(t, `^in (2h|1h59m)$`, text(t, ctx, row(heldID)+` [data-test="row-next"]`), "a pause with an end ends then")
	waiting := text(t, ctx, `[data-test="detail"] dl`)
	require.Contains(t, waiting, "pause since")
	require.Contains(t, waiting, "hold key dash_waiting; uses no retry")
	require.Regexp(t, `Hold ends\s+until released, at most until `, waiting)
	require.NotContains(t, waiting, "Next attempt")
	require.Contains(t, text(t, ctx, `[data-test="why"]`), "runs when the hold is released (at most ")
	pause := text(t, ctx, `[data-test="timeline"] li[data-decided-by="pause"]`)
	require.Contains(t, pause, "held until released, at most until ")
	require.NotContains(t, pause, "runs at", "the decision's time is max_hold's, no attempt's")
	shot(t, ctx, "held")

	t.Log("a resume releases a paused item early")
	// pauseAndResume holds a new item under key, paused, and releases
	// every hold of key.
	pauseAndResume := func(key string, ownerAdmits bool) string {
		id := contract.NewID()
		b.held(t, contract.HeldData{Kind: contract.KindJob, ID: id, Attempt: 1, JobType: "dash_hold", Reason: contract.HoldPause,
			HoldKey: key, Detail: "source_paused: source is paused"})
		b.waitRetry(t, "job", id, "scheduled")
		b.released(t, contract.ReleasedData{Kind: contract.KindJob, HoldKey: key, Reason: contract.ReleaseResume,
			By: "test", ReleasedAt: time.Now(), OwnerAdmits: ownerAdmits})
		return id
	}
	pausedID := pauseAndResume("dash_resumed", false)
	b.waitRetry(t, "job", pausedID, "due")
	openItem(pausedID)
	require.NoError(t, chromedp.Do(ctx, chromedp.WaitVisible(chromedp.CSS(`[data-test="timeline"] li[data-decided-by="resume"]`))))
	require.Contains(t, text(t, ctx, `[data-test="timeline"] li[data-decided-by="pause"]`), "paused without an end")
	released := text(t, ctx, `[data-test="timeline"] li[data-decided-by="resume"]`)
	require.Contains(t, released, "Released early: the source resumed, no retry spent")
	require.Contains(t, released, "hold key dash_resumed")

	t.Log("an item its owner admitted after a release says so on its close")
	admittedID := pauseAndResume("dash_admitted", true)
	m, err := contract.NewLifecycleMsg("retryd/test", contract.Succeeded, contract.SucceededData{Kind: contract.KindJob, ID: admittedID, Attempt: 2}, time.Now())
	b.publish(t, m, err)
	b.waitRetry(t, "job", admittedID, "succeeded")
	openItem(admittedID)
	require.NoError(t, chromedp.Do(ctx, chromedp.WaitVisible(chromedp.CSS(`[data-test="timeline"] li[data-event="succeeded"][data-decided-by="resume"]`))))
	require.Contains(t, text(t, ctx, `[data-test="timeline"] li[data-event="succeeded"]`), "Admitted by its owner after a release (the source resumed), no retry spent")
	require.NoError(t, chromedp.Do(ctx,
		chromedp.Navigate(b.api+"/ui/#/retries?state=succeeded&job_type=dash_hold"),
		chromedp.WaitVisible(chromedp.CSS(row(admittedID)+` [data-test="row-hold"]`)),
	))
	require.Equal(t, "held (pause), no error", text(t, ctx, row(admittedID)+` [data-test="row-hold"]`), "its last reason is its hold's")
	require.Zero(t, eval[int](t, ctx, fmt.Sprintf(`document.querySelectorAll(%q).length`, row(admittedID)+` .err`)), "no error styling")

	t.Log("an item held past its max_hold explains why it was exhausted")
	expiredID := contract.NewID()
	throttled := contract.HeldData{Kind: contract.KindJob, ID: expiredID, Attempt: 1, JobType: "dash_expire", Reason: contract.HoldThrottle,
		HoldKey: "dash_busy", Detail: "rate limit of 10 per 1s reached"}
	b.held(t, throttled)
	b.waitRetry(t, "job", expiredID, "due") // after the max_hold of 1s
	throttled.Attempt = 2
	b.held(t, throttled)
	b.waitRetry(t, "job", expiredID, "exhausted")
	openItem(expiredID)
	require.NoError(t, chromedp.Do(ctx, chromedp.WaitVisible(chromedp.CSS(`[data-test="timeline"] li[data-event="exhausted"]`))))
	why = text(t, ctx, `[data-test="why"]`)
	require.Contains(t, why, "retryd gave up: it was held longer than max_hold 1s since")
	require.Contains(t, why, "holds spent none of its retries")
	exhausted := text(t, ctx, `[data-test="timeline"] li[data-event="exhausted"]`)
	require.Contains(t, exhausted, "reason hold expired")
	require.Contains(t, exhausted, "held longer than max_hold 1s since")
	capped := text(t, ctx, `[data-test="timeline"] li[data-decided-by="hold"]`)
	require.Contains(t, capped, "Held back by its owner (a rate limit or throttle), no retry spent")
	require.Contains(t, capped, "capped by the policy's max_hold of 1s")
	shot(t, ctx, "hold-expired")

	t.Log("analytics charts")
	require.NoError(t, chromedp.Do(ctx,
		chromedp.Navigate(b.api+"/ui/#/analytics"),
		chromedp.WaitVisible(chromedp.CSS(`[data-test="analytics-card"][data-job-type="dash_flaky"]`)),
		chromedp.WaitVisible(chromedp.CSS(`[data-test="analytics-outcomes"] svg rect`)),
		chromedp.WaitVisible(chromedp.CSS(`[data-test="analytics-errors"] svg rect`)),
	))
	require.Contains(t, eval[string](t, ctx, `document.querySelector('[data-test="analytics-errors"]').innerHTML`), "dash_flaky · timeout")
	require.Contains(t, eval[string](t, ctx, `document.querySelector('[data-test="analytics-kinds"] tr[data-kind="job"]').textContent`), "timeout",
		"every kind's retried work, with its errors by class")
	shot(t, ctx, "analytics")

	t.Log("pause a source")
	require.NoError(t, chromedp.Do(ctx,
		chromedp.Navigate(b.api+"/ui/#/sources"),
		clickLive(`tr[data-source="dash_source"] [data-test="pause"]`),
		giveReason("maintenance"),
		chromedp.WaitVisible(chromedp.CSS(`tr[data-source="dash_source"] [data-test="resume"]`)),
	))
	var s sourceView
	b.okJSON(t, &s, "sources", "show", "dash_source")
	require.True(t, s.Paused)
	require.Equal(t, "maintenance", s.PauseReason)

	t.Log("edit a policy")
	require.NoError(t, chromedp.Do(ctx,
		chromedp.Navigate(b.api+"/ui/#/policies"),
		clickLive(`tr[data-policy="job/dash_email"] [data-test="edit-policy"]`),
		chromedp.WaitVisible(chromedp.CSS(`[data-test="policy-editor"] svg rect`)),
		chromedp.WaitVisible(chromedp.CSS(`[data-test="policy-editor"] input[name="max_retries"]`)),
		chromedp.SetValue(chromedp.CSS(`[data-test="policy-editor"] input[name="max_retries"]`), "6"),
		chromedp.Click(chromedp.CSS(`[data-test="save-policy"]`)),
		poll(`document.querySelector('[data-test="policy-editor"] h2')?.textContent.includes("(v2)")`),
	))
	var p policy.Policy
	b.okJSON(t, &p, "policies", "get", "job", "dash_email")
	require.Equal(t, 6, p.MaxRetries)
	require.Equal(t, 2, p.Version)
	require.Equal(t, time.Hour, p.Backoff.Base, "fields not edited are kept")
	require.Equal(t, policy.DefaultMaxHold, p.MaxHold, "fields not edited are kept")
	require.Equal(t, policy.DefaultMaxRetryAfter, p.MaxRetryAfter, "fields not edited are kept")

	t.Log("a new policy starts from the API's template")
	require.NoError(t, chromedp.Do(ctx,
		chromedp.Click(chromedp.CSS(`[data-test="new-policy"]`)),
		chromedp.WaitVisible(chromedp.CSS(`[data-test="policy-editor"] input[name="kind"]`)),
	))
	tmpl := policy.Template("job", "")
	require.Equal(t, strconv.Itoa(tmpl.MaxRetries), eval[string](t, ctx, `document.querySelector('[data-test="policy-editor"] input[name="max_retries"]').value`))
	require.Equal(t, strconv.FormatInt(tmpl.MaxHold.Milliseconds(), 10), eval[string](t, ctx, `document.querySelector('[data-test="policy-editor"] input[name="max_hold"]').value`))
	require.NoError(t, chromedp.Do(ctx,
		clickLive(`tr[data-policy="job/dash_email"] [data-test="edit-policy"]`),
		chromedp.WaitVisible(chromedp.CSS(`[data-test="policy-editor"] input[name="max_retries"]`)),
		poll(`document.querySelector('[data-test="policy-editor"] input[name="max_retries"]')?.value === "6"`),
	))

	t.Log("give an error class its own backoff, and a max hold")
	editor := `[data-test="policy-editor"] `
	timeout := editor + `.class-backoff[data-class="timeout"] `
	require.NoError(t, chromedp.Do(ctx,
		chromedp.SetValue(chromedp.CSS(editor+`[data-test="class-backoff-class"]`), "timeout"),
		chromedp.Click(chromedp.CSS(editor+`[data-test="class-backoff-add"]`)),
		chromedp.WaitVisible(chromedp.CSS(timeout+`input[name="base_delay_ms"]`)),
		chromedp.SetValue(chromedp.CSS(timeout+`input[name="base_delay_ms"]`), "200"),
		chromedp.SetValue(chromedp.CSS(timeout+`input[name="max_delay_ms"]`), "2000"),
		chromedp.SetValue(chromedp.CSS(timeout+`input[name="first_delay_ms"]`), "0"),
		chromedp.SetValue(chromedp.CSS(editor+`input[name="max_hold"]`), "3600000"),
		chromedp.Click(chromedp.CSS(`[data-test="save-policy"]`)),
		poll(`document.querySelector('[data-test="policy-editor"] h2')?.textContent.includes("(v3)")`),
	))
	b.okJSON(t, &p, "policies", "get", "job", "dash_email")
	require.Equal(t, 3, p.Version)
	require.Equal(t, time.Hour, p.MaxHold)
	require.Len(t, p.ClassBackoff, 1)
	cb := p.ClassBackoff[errclass.Timeout]
	require.NotNil(t, cb.Base)
	require.NotNil(t, cb.Max)
	require.NotNil(t, cb.FirstDelay)
	require.Equal(t, 200*time.Millisecond, *cb.Base)
	require.Equal(t, 2*time.Second, *cb.Max)
	require.Equal(t, time.Duration(0), *cb.FirstDelay)
	require.Nil(t, cb.Multiplier, "fields left blank keep the policy's")
	// Shown back: the editor is drawn again from the API's answer.
	require.Equal(t, "200", eval[string](t, ctx, fmt.Sprintf(`document.querySelector(%q).value`, timeout+`input[name="base_delay_ms"]`)))
	require.Equal(t, "", eval[string](t, ctx, fmt.Sprintf(`document.querySelector(%q).value`, timeout+`input[name="multiplier"]`)))
	require.Equal(t, "3600000", eval[string](t, ctx, fmt.Sprintf(`document.querySelector(%q).value`, editor+`input[name="max_hold"]`)))
	require.Contains(t, text(t, ctx, editor+`[data-test="class-preview"]`), "timeout")
	require.NoError(t, chromedp.Do(ctx,
		poll(`document.querySelector('tr[data-policy="job/dash_email"]')?.innerText.includes("own backoff: timeout")`)))
	shot(t, ctx, "policy-class-backoff")

	t.Log("the API's validation error is shown at its field")
	errs.allow400("/v1/policies/job/dash_email")
	require.NoError(t, chromedp.Do(ctx,
		chromedp.SetValue(chromedp.CSS(timeout+`input[name="multiplier"]`), "0.5"),
		chromedp.Click(chromedp.CSS(`[data-test="save-policy"]`)),
		chromedp.WaitVisible(chromedp.CSS(timeout+`[data-test="field-error"]`)),
	))
	require.Contains(t, text(t, ctx, timeout+`[data-test="field-error"]`), "class_backoff.timeout.multiplier must be a number >= 1")
	require.Contains(t, text(t, ctx, editor+`[data-test="policy-error"]`), "class_backoff.timeout.multiplier")
	b.okJSON(t, &p, "policies", "get", "job", "dash_email")
	require.Equal(t, 3, p.Version, "an invalid policy is not saved")

	require.Empty(t, errs.list(), "the page logged errors")
	require.False(t, strings.Contains(eval[string](t, ctx, `document.getElementById("banner").textContent`), "failed"))
}
