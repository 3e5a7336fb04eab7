package main

import (
	"fmt"
	"slices"
	"strings"
	"testing"
	"time"

	"github.com/chromedp/chromedp"
	"github.com/chromedp/chromedp/kb"
	"github.com/stretchr/testify/require"

	"github.com/retryd/retryd/pkg/contract"
)

// TestDashboardRunsBrowser drives the Runs tab in headless Chromium: the
// list of workflow runs, its filters kept in the address and its pages, a
// retrying run's retry state and steps (node, status, attempts, error,
// executor, output), a retry by hand, and the refusal of a retry for a run
// that has none at the scheduler. The runs and steps are written straight
// into the database, as the triggers service would have.
func TestDashboardRunsBrowser(t *testing.T) {
	t.Parallel()
	ctx := browser(t)
	b := setup(t, nil)
	now := time.Now().UTC()
	retrying, dead, done, running := "run-dr-retrying", "run-dr-dead", "run-dr-done", "run-dr-running"
	b.insertRun(t, done, "onboard", "completed", now.Add(-4*time.Minute), "finished_at = now(), executor = 'engine-2'")
	b.insertRun(t, dead, "billing", "failed_max_retries", now.Add(-3*time.Minute),
		`attempt = 4, retry_count = 3, max_retries = 3, last_error_class = 'rate_limit', last_error_message = 'psp: 429',
		 last_error_timestamp = now(), finished_at = now()`)
	b.insertRun(t, retrying, "onboard", "retrying", now.Add(-2*time.Minute),
		`attempt = 2, retry_count = 1, max_retries = 3, current_node_id = 'enrich', last_error_class = 'timeout',
		 last_error_message = 'crm timed out after 30s', last_error_timestamp = now(), next_retry_at = now() + interval '1 hour',
		 executor = 'engine-7'`)
	b.insertRun(t, running, "onboard", "in_progress", now.Add(-time.Minute), "current_node_id = 'fetch'")
	b.insertRunStep(t, retrying, "fetch", 0, "completed", 2, "none", "", "", "engine-7", `{"rows":3}`)
	b.insertRunStep(t, retrying, "enrich", 1, "failed", 2, "scheduled", "timeout", "crm timed out after 30s", "engine-7", "")
	// The scheduler has the retrying run's retry, as the triggers service
	// reported its failure; the failed_max_retries one has none (it failed
	// before run retries existed).
	b.failed(t, contract.FailedData{Kind: contract.KindRun, ID: retrying, Attempt: 1,
		Error: contract.ErrorInfo{Class: "timeout", Message: "crm timed out after 30s"}})
	b.waitRetry(t, contract.KindRun, retrying, "scheduled")

	errs := watchConsole(ctx)
	const list = `[data-test="runs-list"]`
	row := func(id string) string { return fmt.Sprintf(`%s tr[data-id=%q]`, list, id) }

	t.Log("load: every run, newest first")
	require.NoError(t, chromedp.Do(ctx,
		chromedp.Navigate(b.api+"/ui/#/runs"),
		rowsAre(t, list, retrying, dead, done, running),
	))
	require.True(t, eval[bool](t, ctx, `document.querySelector('.tabs a[data-view="runs"]').classList.contains("active")`))
	require.Equal(t, []string{running, retrying, dead, done},
		eval[[]string](t, ctx, `[...document.querySelectorAll('[data-test="runs-list"] tbody tr[data-id]')].map(r => r.dataset.id)`))
	require.Contains(t, text(t, ctx, row(retrying)), "1/3")
	require.Contains(t, text(t, ctx, row(retrying)), "enrich")
	require.Contains(t, text(t, ctx, row(retrying)), "timeout")
	require.Contains(t, text(t, ctx, row(dead)), "failed max retries")
	require.Equal(t, "4 runs", text(t, ctx, `[data-test="runs-count"]`))
	shot(t, ctx, "runs")

	t.Log("filter by workflow, status and error class")
	require.NoError(t, chromedp.Do(ctx,
		chromedp.SendKeys(chromedp.CSS(`input[data-test="runs-filter-workflow"]`), "onboard"+kb.Enter),
		rowsAre(t, list, retrying, done, running),
		pick("runs", "status", "retrying"),
		rowsAre(t, list, retrying),
	))
	hash := eval[string](t, ctx, `location.hash`)
	require.Contains(t, hash, "workflow=onboard")
	require.Contains(t, hash, "status=retrying")
	require.NoError(t, chromedp.Do(ctx,
		chromedp.Navigate(b.api+"/ui/#/runs?status=permanently_failed"),
		rowsAre(t, list, dead),
		pick("runs", "status", ""),
		pick("runs", "error_class", "timeout"),
		rowsAre(t, list, retrying),
	))
	require.Contains(t, eval[string](t, ctx, `location.hash`), "error_class=timeout")
	require.Equal(t, "", eval[string](t, ctx, `document.querySelector('input[data-test="runs-filter-workflow"]').value`),
		"the filters follow the hash")

	t.Log("a page at a time")
	require.NoError(t, chromedp.Do(ctx,
		chromedp.Navigate(b.api+"/ui/#/runs?limit=3"),
		poll(`document.querySelectorAll('[data-test="runs-list"] tbody tr[data-id]').length === 3`),
		chromedp.Click(chromedp.CSS(`[data-test="runs-more"]`)),
		rowsAre(t, list, retrying, dead, done, running),
		poll(`document.querySelector('[data-test="runs-more"]').hidden`),
	))

	t.Log("a retrying run: its retry state and its steps")
	require.NoError(t, chromedp.Do(ctx,
		chromedp.Navigate(b.api+"/ui/#/runs?workflow=onboard"),
		rowsAre(t, list, retrying, done, running),
		clickLive(row(retrying)),
		chromedp.WaitVisible(chromedp.CSS(`[data-test="run-steps"] tr[data-node="enrich"]`)),
	))
	require.Contains(t, eval[string](t, ctx, `location.hash`), "run="+retrying)
	require.Equal(t, "retrying", eval[string](t, ctx, `document.querySelector('[data-test="run-status"]').dataset.status`))
	require.Equal(t, "2", text(t, ctx, `[data-test="run-attempt"]`))
	require.Equal(t, "1 of 3", text(t, ctx, `[data-test="run-retries"]`))
	require.Regexp(t, `in (1h|59m)`, text(t, ctx, `[data-test="run-next-retry"]`))
	require.Equal(t, "timeout: crm timed out after 30s", text(t, ctx, `[data-test="run-last-error"]`))
	require.Equal(t, "engine-7", text(t, ctx, `[data-test="run-executor"]`))
	require.Equal(t, []string{"fetch", "enrich"},
		eval[[]string](t, ctx, `[...document.querySelectorAll('[data-test="run-steps"] tbody tr')].map(r => r.dataset.node)`))
	fetch := `[data-test="run-steps"] tr[data-node="fetch"] `
	require.Equal(t, "completed", eval[string](t, ctx, `document.querySelector('[data-test="run-steps"] tr[data-node="fetch"]').dataset.status`))
	require.Equal(t, "2", text(t, ctx, fetch+`[data-test="step-attempts"]`))
	require.Equal(t, `{"rows":3}`, text(t, ctx, fetch+`[data-test="step-output"]`))
	require.Equal(t, "engine-7", text(t, ctx, fetch+`[data-test="executor"]`))
	enrich := `[data-test="run-steps"] tr[data-node="enrich"] `
	require.Equal(t, "failed", eval[string](t, ctx, `document.querySelector('[data-test="run-steps"] tr[data-node="enrich"]').dataset.status`))
	require.Equal(t, "timeout: crm timed out after 30s", text(t, ctx, enrich+`[data-test="step-error"]`))
	require.Equal(t, "engine-7", text(t, ctx, enrich+`[data-test="executor"]`))
	require.Equal(t, "", text(t, ctx, enrich+`[data-test="step-output"]`))
	shot(t, ctx, "run-detail")

	t.Log("retry it by hand: the scheduler's retry of kind run")
	require.NoError(t, chromedp.Do(ctx,
		clickLive(`[data-test="run-retry"]`),
		giveReason("crm back up"),
		poll(`document.querySelector('.dialog') === null`),
	))
	v := b.waitRetry(t, contract.KindRun, retrying, "due")
	require.Equal(t, 3, v.Retry.Attempt, "attempt 2 was scheduled after the failure; the manual retry replaces it")
	require.True(t, slices.ContainsFunc(v.History, func(h historyEntry) bool { return h.Event == "rescheduled" && h.DecidedBy == "manual" }),
		"history: %v", events(v.History))

	t.Log("its retry timeline: the scheduler's decisions, on the Retries tab")
	require.NoError(t, chromedp.Do(ctx,
		clickLive(`[data-test="run-retry-history"]`),
		poll(`document.querySelector('.tabs a[data-view="retries"]').classList.contains("active")`),
		poll(`document.querySelector('[data-test="timeline"]')?.innerText.includes("crm back up")`),
	))
	require.Equal(t, "due", eval[string](t, ctx, `document.querySelector('[data-test="detail-state"]').dataset.state`))
	require.NoError(t, chromedp.Do(ctx,
		chromedp.Navigate(b.api+"/ui/#/runs?workflow=onboard"),
		rowsAre(t, list, retrying, done, running),
	))

	t.Log("a run in progress offers no retry")
	require.NoError(t, chromedp.Do(ctx,
		clickLive(row(running)),
		poll(fmt.Sprintf(`document.querySelector('[data-test="run-detail"] h2')?.textContent === %q`, "run / "+running)),
	))
	require.True(t, eval[bool](t, ctx, `document.querySelector('[data-test="run-retry"]') === null`))
	require.Contains(t, text(t, ctx, `[data-test="run-detail"]`), "No step reported yet.")

	t.Log("a failed run without a retry at the scheduler: the refusal says why")
	require.NoError(t, chromedp.Do(ctx,
		chromedp.Navigate(b.api+"/ui/#/runs?run="+dead),
		poll(fmt.Sprintf(`document.querySelector('[data-test="run-detail"] h2')?.textContent === %q`, "run / "+dead)),
		clickLive(`[data-test="run-retry"]`),
		confirmDialog(),
		chromedp.WaitVisible(chromedp.CSS(`.dialog .error`)),
	))
	require.Contains(t, text(t, ctx, `.dialog .error`), "has no retry at the scheduler: only a run that failed can be retried")
	require.NoError(t, chromedp.Do(ctx, chromedp.KeyEvent(kb.Escape)))

	// Chromium logs every failed request: the refused retry's 404 is the
	// one the test asked for.
	logged := slices.DeleteFunc(errs.list(), func(m string) bool {
		return strings.Contains(m, "status of 404") && strings.Contains(m, "/v1/retries/run/"+dead+"/retry")
	})
	require.Empty(t, logged, "the page logged errors")
	require.False(t, strings.Contains(eval[string](t, ctx, `document.getElementById("banner").textContent`), "failed"))
}

// TestDashboardRunsViewer: a viewer reads a run and is offered no retry.
func TestDashboardRunsViewer(t *testing.T) {
	t.Parallel()
	ctx := browser(t)
	b := setupTokens(t)
	viewer := b.viewerToken(t, "runs-viewer")
	id := "run-dr-viewer"
	b.insertRun(t, id, "onboard", "retrying", time.Now().UTC(), "last_error_class = 'timeout', next_retry_at = now() + interval '1 hour'")
	b.insertRunStep(t, id, "fetch", 0, "failed", 1, "scheduled", "timeout", "upstream timed out", "engine-1", "")

	require.NoError(t, chromedp.Do(ctx,
		chromedp.Navigate(b.api+"/ui/#/runs?run="+id),
		signIn(viewer, "runs-viewer (viewer)"),
		chromedp.WaitVisible(chromedp.CSS(`[data-test="run-steps"] tr[data-node="fetch"]`)),
	))
	require.True(t, eval[bool](t, ctx, `document.querySelector('[data-test="run-retry"]')?.offsetParent === null`), "a viewer is offered no retry")
}
