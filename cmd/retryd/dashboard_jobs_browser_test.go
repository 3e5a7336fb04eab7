package main

import (
	"fmt"
	"slices"
	"strings"
	"testing"

	"github.com/chromedp/chromedp"
	"github.com/chromedp/chromedp/kb"
	"github.com/stretchr/testify/require"

	"github.com/retryd/retryd/pkg/contract"
)

// TestDashboardJobsBrowser drives the Jobs tab in headless Chromium: the
// failed jobs that need an operator, the list's filters and its pages, a
// job's attempts with the worker instance that ran them, a retry and a
// cancel, then a bulk retry from its dry run to its finished operation.
func TestDashboardJobsBrowser(t *testing.T) {
	t.Parallel()
	ctx := browser(t)
	b := setup(t, nil)
	// Slow policies keep the retrying jobs retrying while the test looks.
	for _, jt := range []string{"dj_email", "dj_crm"} {
		b.ok(t, "policies", "set", "job", jt, "--max-retries", "3", "--base-delay", "1h", "--max-delay", "2h", "--jitter", "none")
	}
	email1, email2, crm := contract.NewID(), contract.NewID(), contract.NewID()
	b.failed(t, contract.FailedData{Kind: contract.KindJob, ID: email1, Attempt: 1, JobType: "dj_email", Executor: "dj-worker-1",
		Error: contract.ErrorInfo{Class: "timeout", Message: "smtp: timed out after 5s"}})
	b.fail(t, email2, "dj_email", 1, "network", "dial tcp 10.0.0.7:587: connection refused")
	b.failed(t, contract.FailedData{Kind: contract.KindJob, ID: crm, Attempt: 1, JobType: "dj_crm", Priority: contract.PriorityHigh,
		Error: contract.ErrorInfo{Class: "rate_limit", Message: "crm: 429 too many requests"}})
	// Without retries they fail for good at once: they need an operator.
	dead := []string{contract.NewID(), contract.NewID()}
	for _, id := range dead {
		b.failed(t, contract.FailedData{Kind: contract.KindJob, ID: id, Attempt: 1, JobType: "dj_crm", MaxRetries: new(0), Executor: "dj-worker-2",
			Error: contract.ErrorInfo{Class: "timeout", Message: "crm: upstream timed out"}})
	}
	for _, id := range []string{email1, email2, crm} {
		b.waitJob(t, id, jobStatus("retrying"))
	}
	for _, id := range dead {
		b.waitJob(t, id, jobStatus("failed_max_retries"))
	}

	errs := watchConsole(ctx)
	const list, attention = `[data-test="jobs-list"]`, `[data-test="jobs-attention"]`
	// empty clears a text input without an event, as a user's select-all
	// does before typing.
	empty := func(sel string) chromedp.Action[chromedp.Void] {
		return chromedp.Evaluate[chromedp.Void](fmt.Sprintf(`(() => { document.querySelector(%q).value = ""; })()`, sel))
	}
	row := func(scope, id string) string { return fmt.Sprintf(`%s tr[data-id=%q]`, scope, id) }

	t.Log("load: the jobs given up on need attention, every job is listed")
	require.NoError(t, chromedp.Do(ctx,
		chromedp.Navigate(b.api+"/ui/#/jobs"),
		rowsAre(t, attention, dead...),
		rowsAre(t, list, email1, email2, crm, dead[0], dead[1]),
	))
	require.True(t, eval[bool](t, ctx, `document.querySelector('.tabs a[data-view="jobs"]').classList.contains("active")`))
	require.Contains(t, text(t, ctx, row(attention, dead[0])), "failed max retries")
	require.Contains(t, text(t, ctx, row(attention, dead[0])), "0/0")
	require.Contains(t, text(t, ctx, row(list, crm)), "rate_limit")
	require.Contains(t, text(t, ctx, row(list, crm)), "1/3")
	require.Equal(t, "high", text(t, ctx, row(list, crm)+` [data-test="priority"]`))
	require.Equal(t, "normal", text(t, ctx, row(list, email1)+` [data-test="priority"]`))
	shot(t, ctx, "jobs")

	t.Log("filter by job type, status and error class")
	require.NoError(t, chromedp.Do(ctx,
		chromedp.SendKeys(chromedp.CSS(`input[data-test="jobs-filter-job_type"]`), "dj_crm"+kb.Enter),
		rowsAre(t, list, crm, dead[0], dead[1]),
		pick("jobs", "status", "permanently_failed"),
		rowsAre(t, list, dead...),
		pick("jobs", "status", "retrying"),
		rowsAre(t, list, crm),
	))
	hash := eval[string](t, ctx, `location.hash`)
	require.Contains(t, hash, "job_type=dj_crm")
	require.Contains(t, hash, "status=retrying")
	require.NoError(t, chromedp.Do(ctx,
		empty(`input[data-test="jobs-filter-job_type"]`),
		chromedp.SendKeys(chromedp.CSS(`input[data-test="jobs-filter-job_type"]`), "dj_email"+kb.Enter),
		rowsAre(t, list, email1, email2),
		pick("jobs", "error_class", "network"),
		rowsAre(t, list, email2),
	))
	// The escalation list keeps every type.
	require.NoError(t, chromedp.Do(ctx, rowsAre(t, attention, dead...)))

	t.Log("filter by priority band")
	require.NoError(t, chromedp.Do(ctx,
		chromedp.Navigate(b.api+"/ui/#/jobs?priority=high"),
		rowsAre(t, list, crm),
		pick("jobs", "priority", "normal"),
		rowsAre(t, list, email1, email2, dead[0], dead[1]),
		pick("jobs", "priority", ""),
		rowsAre(t, list, email1, email2, crm, dead[0], dead[1]),
	))

	t.Log("a page at a time")
	require.NoError(t, chromedp.Do(ctx,
		chromedp.Navigate(b.api+"/ui/#/jobs?limit=2"),
		poll(`document.querySelectorAll('[data-test="jobs-list"] tbody tr[data-id]').length === 2`),
		chromedp.Click(chromedp.CSS(`[data-test="jobs-more"]`)),
		poll(`document.querySelectorAll('[data-test="jobs-list"] tbody tr[data-id]').length === 4`),
		chromedp.Click(chromedp.CSS(`[data-test="jobs-more"]`)),
		rowsAre(t, list, email1, email2, crm, dead[0], dead[1]),
		poll(`document.querySelector('[data-test="jobs-more"]').hidden`),
	))
	require.Equal(t, "5 jobs", text(t, ctx, `[data-test="jobs-count"]`))
	require.Equal(t, "", eval[string](t, ctx, `document.querySelector('select[data-test="jobs-filter-error_class"]').value`),
		"the filters follow the hash")

	t.Log("a job's attempts, with the worker instance that ran them")
	require.NoError(t, chromedp.Do(ctx,
		chromedp.Navigate(b.api+"/ui/#/jobs?job_type=dj_email"),
		rowsAre(t, list, email1, email2),
		clickLive(row(list, email1)),
		chromedp.WaitVisible(chromedp.CSS(`[data-test="job-history"] tr[data-event="scheduled"]`)),
	))
	require.Contains(t, eval[string](t, ctx, `location.hash`), "job="+email1)
	require.Equal(t, "retrying", eval[string](t, ctx, `document.querySelector('[data-test="job-status"]').dataset.status`))
	failed := text(t, ctx, `[data-test="job-history"] tr[data-event="failed"]`)
	require.Contains(t, failed, "smtp: timed out after 5s")
	require.Contains(t, failed, "timeout")
	require.Equal(t, "dj-worker-1", text(t, ctx, `[data-test="job-history"] tr[data-event="failed"] [data-test="executor"]`))
	scheduled := text(t, ctx, `[data-test="job-history"] tr[data-event="scheduled"]`)
	require.Contains(t, scheduled, "backoff")
	require.Contains(t, scheduled, "1h")
	facts := text(t, ctx, `[data-test="job-facts"]`)
	require.Contains(t, facts, "1 of 3")
	require.Contains(t, facts, "timeout: smtp: timed out after 5s")
	shot(t, ctx, "job-detail")

	t.Log("retry it by hand")
	require.NoError(t, chromedp.Do(ctx,
		clickLive(`[data-test="job-retry"]`),
		giveReason("upstream fixed"),
		poll(`document.querySelector('[data-test="job-history"] tr[data-event="rescheduled"]')?.innerText.includes("manual")`),
	))
	require.Contains(t, text(t, ctx, `[data-test="job-history"] tr[data-event="rescheduled"]`), "upstream fixed")
	b.waitJob(t, email1, func(v jobView) bool { return v.Job.Attempt == 3 })

	t.Log("cancel another")
	require.NoError(t, chromedp.Do(ctx,
		clickLive(row(list, email2)),
		poll(fmt.Sprintf(`document.querySelector('[data-test="job-detail"] h2')?.textContent === %q`, "job / "+email2)),
		chromedp.WaitVisible(chromedp.CSS(`[data-test="job-cancel"]`)),
		clickLive(`[data-test="job-cancel"]`),
		giveReason("customer left"),
		poll(`document.querySelector('[data-test="job-status"]')?.dataset.status === "cancelled"`),
		poll(`document.querySelector('[data-test="job-cancel"]') === null`),
	))
	require.Contains(t, text(t, ctx, `[data-test="job-history"] tr[data-event="cancelled"]`), "customer left")

	t.Log("bulk retry: a dry run counts, the retry runs to its end")
	bulk := `[data-test="bulk-retry"] `
	require.NoError(t, chromedp.Do(ctx,
		chromedp.SendKeys(chromedp.CSS(bulk+`input[data-test="bulk-job_type"]`), "dj_crm"),
		chromedp.SendKeys(chromedp.CSS(bulk+`input[data-test="bulk-rate"]`), "fast"),
		chromedp.Click(chromedp.CSS(bulk+`[data-test="bulk-dry-run"]`)),
		chromedp.WaitVisible(chromedp.CSS(bulk+`[data-test="bulk-error"]`)),
	))
	require.Contains(t, text(t, ctx, bulk+`[data-test="bulk-error"]`), `Release rate "fast"`)
	require.NoError(t, chromedp.Do(ctx,
		empty(bulk+`input[data-test="bulk-rate"]`),
		chromedp.SendKeys(chromedp.CSS(bulk+`input[data-test="bulk-rate"]`), "5/s"),
		chromedp.SendKeys(chromedp.CSS(bulk+`input[data-test="bulk-reason"]`), "crm back"),
		chromedp.Click(chromedp.CSS(bulk+`[data-test="bulk-dry-run"]`)),
		poll(`document.querySelector('[data-test="bulk-result"]').innerText.includes("Dry run: 2 jobs would be retried")`),
		chromedp.WaitVisible(chromedp.CSS(bulk+`[data-test="bulk-start"]`)),
	))
	require.True(t, eval[bool](t, ctx, `document.querySelector('[data-test="bulk-error"]').hidden`), "the dry run cleared the error")
	require.Equal(t, "Retry 2 jobs", text(t, ctx, bulk+`[data-test="bulk-start"]`))
	require.NoError(t, chromedp.Do(ctx,
		chromedp.Click(chromedp.CSS(bulk+`[data-test="bulk-start"]`)),
		confirmDialog(),
		chromedp.WaitVisible(chromedp.CSS(`[data-test="operation"]`)),
		poll(`document.querySelector('[data-test="operation"]')?.dataset.status === "completed"`),
	))
	counts := text(t, ctx, `[data-test="operation-counts"]`)
	require.Contains(t, counts, "released 2 of 2")
	require.Contains(t, counts, "pending 0")
	require.Contains(t, counts, "5/s")
	opID := eval[string](t, ctx, `document.querySelector('[data-test="operation"]').dataset.id`)
	require.True(t, strings.HasPrefix(opID, "op-"), opID)
	require.NoError(t, chromedp.Do(ctx,
		chromedp.WaitVisible(chromedp.CSS(row(`[data-test="operations"]`, opID))),
		// Retried, they no longer need attention.
		poll(`document.querySelector('[data-test="jobs-attention"] tbody tr[data-id]') === null`),
	))
	shot(t, ctx, "jobs-bulk")
	for _, id := range dead {
		v := b.waitJob(t, id, func(v jobView) bool { return v.Job.Attempt == 2 })
		require.True(t, slices.ContainsFunc(v.History, func(h historyEntry) bool { return h.Event == "rescheduled" && h.DecidedBy == "manual" }),
			"history: %v", events(v.History))
	}

	require.Empty(t, errs.list(), "the page logged errors")
	require.False(t, strings.Contains(eval[string](t, ctx, `document.getElementById("banner").textContent`), "failed"))
}

// TestDashboardJobsViewer: a viewer reads the Jobs tab and is offered no
// retry, cancel or bulk retry; an action asked for all the same shows the
// API's refusal.
func TestDashboardJobsViewer(t *testing.T) {
	t.Parallel()
	ctx := browser(t)
	b := setupTokens(t)
	viewer := b.viewerToken(t, "jobs-viewer")
	id := contract.NewID()
	b.fail(t, id, "dj_viewer", 1, "timeout", "upstream timed out")

	require.NoError(t, chromedp.Do(ctx,
		chromedp.Navigate(b.api+"/ui/#/jobs"),
		signIn(viewer, "jobs-viewer (viewer)"),
		chromedp.WaitVisible(chromedp.CSS(fmt.Sprintf(`[data-test="jobs-list"] tr[data-id=%q]`, id))),
		clickLive(fmt.Sprintf(`[data-test="jobs-list"] tr[data-id=%q]`, id)),
		chromedp.WaitVisible(chromedp.CSS(`[data-test="job-history"] tr[data-event="failed"]`)),
	))
	for _, sel := range []string{`[data-test="job-retry"]`, `[data-test="job-cancel"]`, `[data-test="bulk-dry-run"]`} {
		require.True(t, eval[bool](t, ctx, fmt.Sprintf(`document.querySelector(%q)?.offsetParent === null`, sel)), "a viewer is offered no %s", sel)
	}
	require.NoError(t, chromedp.Do(ctx,
		chromedp.Evaluate[chromedp.Void](`document.querySelector('[data-test="job-retry"]').click()`),
		confirmDialog(),
		chromedp.WaitVisible(chromedp.CSS(`.dialog .error`)),
	))
	require.Contains(t, text(t, ctx, `.dialog .error`), `"jobs-viewer" has role viewer; POST /v1/jobs/`+id+`/retry needs operator`)
}
