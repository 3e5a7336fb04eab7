package main

import (
	"context"
	"encoding/json"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/chromedp/chromedp"
	"github.com/chromedp/chromedp/kb"
	"github.com/stretchr/testify/require"

	"github.com/retryd/retryd/pkg/contract"
	"github.com/retryd/retryd/pkg/errclass"
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

// browser starts headless Chromium with a throwaway profile.
func browser(t *testing.T) context.Context {
	t.Helper()
	path := chromiumPath()
	if path == "" {
		if os.Getenv("CI") == "true" {
			t.Fatal("no chromium binary found: CI must install Debian's chromium package (.ci/run does when this file exists)")
		}
		t.Skip("no chromium binary found (apt-get install -y chromium, or set CHROMIUM): skipping the dashboard browser test")
	}
	allocCtx, cancelAlloc := chromedp.NewExecAllocator(context.Background(),
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
	)
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
				pe.msgs = append(pe.msgs, m.String())
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

// TestDashboardBrowser drives the dashboard in headless Chromium: load it,
// filter, open an item's timeline, cancel it and see its state change; then
// the analytics, a source's pause and a policy edit.
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

	t.Log("filter by job type")
	require.NoError(t, chromedp.Do(ctx,
		chromedp.SendKeys(chromedp.CSS(`input[data-test="filter-job_type"]`), "dash_crm"+kb.Enter),
		poll(fmt.Sprintf(`(() => { const ids = [...document.querySelectorAll("tbody tr[data-id]")].map(r => r.dataset.id);
			return ids.length === 1 && ids[0] === %q })()`, crm)),
	))
	require.Contains(t, eval[string](t, ctx, `location.hash`), "job_type=dash_crm")

	t.Log("open the timeline")
	require.NoError(t, chromedp.Do(ctx,
		chromedp.Click(chromedp.CSS(row(crm))),
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
		chromedp.Click(chromedp.CSS(`[data-test="detail"] [data-test="cancel"]`)),
		chromedp.WaitVisible(chromedp.CSS(`.dialog input[name="reason"]`)),
		chromedp.SendKeys(chromedp.CSS(`.dialog input[name="reason"]`), "duplicate contact"),
		chromedp.Click(chromedp.CSS(`[data-test="dialog-confirm"]`)),
		poll(`document.querySelector('[data-test="detail-state"]')?.dataset.state === "cancelled"`),
		chromedp.WaitVisible(chromedp.CSS(`[data-test="timeline"] li[data-event="cancelled"]`)),
		// Cancelled, it leaves the list of pending retries.
		poll(fmt.Sprintf(`document.querySelector(%q) === null`, row(crm))),
	))
	require.Contains(t, eval[string](t, ctx, `document.querySelector('[data-test="timeline"] li[data-event="cancelled"]').innerText`), "duplicate contact")
	v := b.waitRetry(t, "job", crm, "cancelled")
	var detail map[string]string
	require.NoError(t, json.Unmarshal(v.History[len(v.History)-1].Detail, &detail))
	require.Equal(t, map[string]string{"by": "dashboard", "reason": "duplicate contact"}, detail)

	t.Log("analytics charts")
	require.NoError(t, chromedp.Do(ctx,
		chromedp.Navigate(b.api+"/ui/#/analytics"),
		chromedp.WaitVisible(chromedp.CSS(`[data-test="analytics-card"][data-job-type="dash_flaky"]`)),
		chromedp.WaitVisible(chromedp.CSS(`[data-test="analytics-outcomes"] svg rect`)),
		chromedp.WaitVisible(chromedp.CSS(`[data-test="analytics-errors"] svg rect`)),
	))
	require.Contains(t, eval[string](t, ctx, `document.querySelector('[data-test="analytics-errors"]').innerHTML`), "dash_flaky · timeout")
	shot(t, ctx, "analytics")

	t.Log("pause a source")
	require.NoError(t, chromedp.Do(ctx,
		chromedp.Navigate(b.api+"/ui/#/sources"),
		chromedp.Click(chromedp.CSS(`tr[data-source="dash_source"] [data-test="pause"]`)),
		chromedp.SendKeys(chromedp.CSS(`.dialog input[name="reason"]`), "maintenance"),
		chromedp.Click(chromedp.CSS(`[data-test="dialog-confirm"]`)),
		chromedp.WaitVisible(chromedp.CSS(`tr[data-source="dash_source"] [data-test="resume"]`)),
	))
	var s sourceView
	b.okJSON(t, &s, "sources", "show", "dash_source")
	require.True(t, s.Paused)
	require.Equal(t, "maintenance", s.PauseReason)

	t.Log("edit a policy")
	require.NoError(t, chromedp.Do(ctx,
		chromedp.Navigate(b.api+"/ui/#/policies"),
		chromedp.Click(chromedp.CSS(`tr[data-policy="job/dash_email"] [data-test="edit-policy"]`)),
		chromedp.WaitVisible(chromedp.CSS(`[data-test="policy-editor"] svg rect`)),
		chromedp.SetValue(chromedp.CSS(`[data-test="policy-editor"] input[name="max_retries"]`), "6"),
		chromedp.Click(chromedp.CSS(`[data-test="save-policy"]`)),
		poll(`document.querySelector('[data-test="policy-editor"] h2')?.textContent.includes("(v2)")`),
	))
	var p policyView
	b.okJSON(t, &p, "policies", "get", "job", "dash_email")
	require.Equal(t, 6, p.MaxRetries)
	require.Equal(t, 2, p.Version)
	require.EqualValues(t, 3_600_000, p.BaseDelayMS, "fields not edited are kept")

	require.Empty(t, errs.list(), "the page logged errors")
	require.False(t, strings.Contains(eval[string](t, ctx, `document.getElementById("banner").textContent`), "failed"))
}
