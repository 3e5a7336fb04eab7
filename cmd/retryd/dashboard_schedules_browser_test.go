package main

import (
	"testing"

	"github.com/chromedp/chromedp"
	"github.com/stretchr/testify/require"
)

// TestDashboardSchedulesBrowser drives the Schedules tab in headless
// Chromium: the schedules made with the CLI are listed with their
// pattern, time zone and job ids, a job type links to its jobs, and an
// admin deletes one through the confirmation dialog.
func TestDashboardSchedulesBrowser(t *testing.T) {
	t.Parallel()
	ctx := browser(t)
	b := setup(t, nil)
	b.ok(t, "schedules", "create", "report", "nightly", "--cron", "0 30 2 * * *", "--time-zone", "Europe/Paris")
	b.ok(t, "schedules", "create", "heartbeat", "every-hour", "--every", "1h", "--priority", "high")

	errs := watchConsole(ctx)
	const list = `[data-test="schedules-list"]`
	require.NoError(t, chromedp.Do(ctx,
		chromedp.Navigate(b.api+"/ui/#/schedules"),
		poll(`document.querySelectorAll('[data-test="schedules-list"] tr[data-schedule]').length === 2`),
	))
	require.Equal(t, "2 schedules", text(t, ctx, `[data-test="schedules-count"]`))
	nightly := text(t, ctx, list+` tr[data-schedule="report/nightly"]`)
	require.Contains(t, nightly, "0 30 2 * * *")
	require.Contains(t, nightly, "Europe/Paris")
	require.Contains(t, nightly, "sched-nightly-<seq>")
	require.Contains(t, text(t, ctx, list+` tr[data-schedule="heartbeat/every-hour"]`), "@every 1h")
	shot(t, ctx, "schedules")

	t.Log("delete one through the dialog")
	require.NoError(t, chromedp.Do(ctx,
		clickLive(list+` tr[data-schedule="report/nightly"] [data-test="delete-schedule"]`),
		confirmDialog(),
		poll(`document.querySelectorAll('[data-test="schedules-list"] tr[data-schedule]').length === 1`),
	))
	r := cli(t, "--api", b.api, "schedules", "show", "report", "nightly")
	require.NotEqual(t, exitOK, r.code, "the schedule is gone: %s", r.stdout)

	t.Log("a job type opens its jobs")
	require.NoError(t, chromedp.Do(ctx,
		clickLive(list+` tr[data-schedule="heartbeat/every-hour"] a`),
		poll(`location.hash.startsWith("#/jobs") && location.hash.includes("job_type=heartbeat")`),
	))
	require.Empty(t, errs.list(), "the page logged errors")
}
