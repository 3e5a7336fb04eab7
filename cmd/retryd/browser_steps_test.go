package main

import (
	"encoding/json"
	"fmt"
	"slices"
	"testing"

	"github.com/chromedp/chromedp"
	"github.com/stretchr/testify/require"
)

// The steps the dashboard's browser tests share: a tab's list and filters
// and its dialogs are built alike (data-test names of the form
// "<tab>-list", "<tab>-filter-<field>"), so each tab's test drives them
// with the same steps.

// rowsAre is true once the table in scope lists exactly ids, in any order.
func rowsAre(t *testing.T, scope string, ids ...string) chromedp.Action[chromedp.Void] {
	t.Helper()
	want, err := json.Marshal(slices.Sorted(slices.Values(ids)))
	require.NoError(t, err)
	return poll(fmt.Sprintf(`JSON.stringify([...document.querySelectorAll(%q)].map(r => r.dataset.id).sort()) === %q`,
		scope+" tbody tr[data-id]", want))
}

// pick chooses an option of a tab's filter as a user does: the view acts
// on change.
func pick(tab, filter, value string) chromedp.Action[chromedp.Void] {
	return chromedp.Evaluate[chromedp.Void](fmt.Sprintf(`(() => { const s = document.querySelector(%q);
			s.value = %q; s.dispatchEvent(new Event("change")); })()`, `select[data-test="`+tab+`-filter-`+filter+`"]`, value))
}

// giveReason types reason into the dialog an action opened and confirms it.
func giveReason(reason string) chromedp.Action[chromedp.Void] {
	return chromedp.Steps(
		chromedp.WaitVisible(chromedp.CSS(`.dialog input[name="reason"]`)),
		chromedp.SendKeys(chromedp.CSS(`.dialog input[name="reason"]`), reason),
		chromedp.Click(chromedp.CSS(`[data-test="dialog-confirm"]`)),
	)
}

// confirmDialog confirms the dialog an action opened.
func confirmDialog() chromedp.Action[chromedp.Void] {
	return chromedp.Steps(
		chromedp.WaitVisible(chromedp.CSS(`[data-test="dialog-confirm"]`)),
		chromedp.Click(chromedp.CSS(`[data-test="dialog-confirm"]`)),
	)
}

// signIn types token into the dialog asking for one and waits until the
// page names who signed in (whoami: "name (role)").
func signIn(token, whoami string) chromedp.Action[chromedp.Void] {
	const input = `.dialog input[name="token"]`
	return chromedp.Steps(
		chromedp.WaitVisible(chromedp.CSS(input)),
		chromedp.SendKeys(chromedp.CSS(input), token),
		chromedp.Click(chromedp.CSS(`[data-test="dialog-confirm"]`)),
		poll(fmt.Sprintf(`document.getElementById("whoami").textContent === %q`, whoami)),
	)
}

// clickLive clicks the first element sel matches, found and clicked in one
// step of the page: the live refresh redraws list rows and a detail
// panel's buttons every few seconds, so a node that one step found may be
// gone by the next (chromedp's "Could not find node with given id", seen
// under load). Use it for anything in a list or a detail panel.
func clickLive(sel string) chromedp.Action[chromedp.Void] {
	return poll(fmt.Sprintf(`(() => { const el = document.querySelector(%q); if (!el) return false; el.click(); return true; })()`, sel))
}
