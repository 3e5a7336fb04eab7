// The jobs view's bulk retry: a dry run counts the jobs a filter selects,
// then a retry of them starts an operation that releases them at a rate,
// followed by polling its progress until it finishes. The recent
// operations can be followed again after a reload.

import { api } from "./api.js";
import { h, clear, badge, relTime } from "./dom.js";
import { actionDialog, toast } from "./dialog.js";

// How often a running operation's progress is read.
const POLL_MS = 1000;
const RECENT = 5;

// panel builds the bulk retry panel. refresh reads the recent operations;
// destroy stops following an operation when the view goes away.
export function panel({ statuses, classes, givenUp }) {
  const f = {};
  const input = (name, label, attrs = {}) => {
    f[name] = h("input", { name, "data-test": `bulk-${name}`, oninput: stale, ...attrs });
    return h("label", {}, label, f[name]);
  };
  const select = (name, label, options) => {
    f[name] = h("select", { name, "data-test": `bulk-${name}`, onchange: stale }, options.map(([v, text]) => h("option", { value: v, text })));
    return h("label", {}, label, f[name]);
  };
  const result = h("div", { "data-test": "bulk-result" });
  const error = h("div", { class: "err", "data-test": "bulk-error", hidden: true });
  const start = h("button", { class: "primary", "data-test": "bulk-start", hidden: true, onclick: () => startRetry().catch((e) => showError(e.message)) });
  const progress = h("div", { "data-test": "bulk-progress" });
  const recent = h("tbody");
  let dry = null; // the last dry run: {body, matched}
  let following = null;
  let timer = null;

  const el = h("section", { class: "panel", "data-test": "bulk-retry" },
    h("div", { class: "panel-head" }, h("h2", { text: "Bulk retry" }),
      h("span", { class: "count", text: "Operator role. Count first with a dry run." })),
    h("div", { class: "panel-body stack" },
      h("div", { class: "form needs-operator" },
        input("job_type", "Job type", { placeholder: "e.g. send_email" }),
        select("status", "Status", [[givenUp, "failed or failed_max_retries"], ...statuses.map((s) => [s, s])]),
        select("error_class", "Last error class (optional)", [["", "any class"], ...classes.map((c) => [c, c])]),
        input("rate", "Release rate", { placeholder: "e.g. 5/s (default 10/s)" }),
        input("reason", "Reason", { placeholder: "e.g. smtp relay back" }),
        h("div", { class: "actions wide" },
          h("button", { "data-test": "bulk-dry-run", onclick: () => dryRun(), text: "Dry run" }),
          start)),
      error,
      result,
      progress,
      h("div", {}, h("div", { class: "hint", text: "Recent bulk operations" }),
        h("table", { "data-test": "operations" }, recent))));

  // stale drops the dry run's answer once the form changes: its count is
  // for the filter as it was.
  function stale() {
    dry = null;
    start.hidden = true;
    clear(result);
  }

  function showError(msg) {
    error.textContent = msg || "";
    error.hidden = !msg;
  }

  // body reads the form as the API's request, without dry_run. A job type
  // is required, as retryd jobs bulk-retry requires --type: a retry of
  // every type at once is rarely what is meant.
  function body() {
    const jobType = f.job_type.value.trim();
    if (!jobType) throw new Error("Give a job type.");
    const filter = { job_type: jobType, status: f.status.value };
    if (f.error_class.value) filter.error_class = f.error_class.value;
    const b = { filter };
    const rate = parseRate(f.rate.value.trim());
    if (rate !== undefined) b.rate_per_second = rate;
    if (f.reason.value.trim()) b.reason = f.reason.value.trim();
    return b;
  }

  async function dryRun() {
    stale();
    showError("");
    try {
      const b = body();
      const res = await api.bulkRetry({ ...b, dry_run: true });
      dry = { body: b, matched: res.matched };
    } catch (e) {
      showError(e.message);
      return;
    }
    result.textContent = `Dry run: ${dry.matched} ${dry.matched === 1 ? "job" : "jobs"} would be retried; nothing was changed.`;
    start.textContent = `Retry ${dry.matched} ${dry.matched === 1 ? "job" : "jobs"}`;
    start.hidden = dry.matched === 0;
  }

  async function startRetry() {
    const { body: b, matched } = dry;
    const res = await actionDialog({
      title: `Retry ${matched} ${b.filter.job_type} jobs?`,
      message: `They are released oldest first, ${b.rate_per_second ?? 10} a second. Jobs that changed since the dry run are counted as they are now.`,
      confirm: "Start bulk retry",
      action: () => api.bulkRetry({ ...b, dry_run: false }),
    });
    if (!res) return;
    stale();
    toast(`Started ${res.operation.id}`);
    follow(res.operation.id);
    await refresh();
  }

  // follow polls the operation's progress until it is no longer running.
  function follow(id) {
    clearTimeout(timer);
    following = id;
    const tick = async () => {
      let res;
      try {
        res = await api.getOperation(id);
      } catch (e) {
        if (following !== id) return;
        showError(`Progress of ${id}: ${e.message}`);
        // Gone is final; anything else (the API restarting) may pass.
        if (e.status !== 404) timer = setTimeout(tick, POLL_MS * 5);
        return;
      }
      if (following !== id) return;
      showError("");
      drawProgress(res);
      if (res.operation.status === "running") timer = setTimeout(tick, POLL_MS);
      else refresh().catch((e) => showError(e.message));
    };
    return tick();
  }

  function drawProgress({ operation: o, problems = [] }) {
    const done = o.released + o.skipped + o.failed;
    clear(progress).appendChild(h("div", { class: "operation", "data-test": "operation", "data-id": o.id, "data-status": o.status },
      h("div", { class: "actions" },
        h("span", { class: "mono", text: o.id }), badge(o.status),
        o.status === "running" ? h("button", { class: "small danger needs-operator", "data-test": "operation-cancel", onclick: () => cancel(o.id), text: "Stop" }) : null),
      h("progress", { max: o.total || 1, value: o.total ? done : 1 }),
      h("div", { class: "muted", "data-test": "operation-counts",
        text: `released ${o.released} of ${o.total} · skipped ${o.skipped} · failed ${o.failed} · pending ${o.pending} · ${o.rate_per_second}/s` }),
      problems.length ? h("ul", { class: "problems" }, problems.map((it) =>
        h("li", {}, h("span", { class: "id", text: it.job_id }), ` ${it.state}${it.error ? `: ${it.error}` : ""}`))) : null));
  }

  async function cancel(id) {
    const done = await actionDialog({
      title: `Stop ${id}?`,
      message: "Jobs not released yet stay as they are; those released keep their new attempt.",
      confirm: "Stop", danger: true,
      action: () => api.cancelOperation(id),
    });
    if (done) { toast(`Stopped ${id}`); await follow(id); }
  }

  async function refresh() {
    const { operations } = await api.listOperations({ limit: RECENT });
    clear(recent);
    if (!operations.length) {
      recent.appendChild(h("tr", {}, h("td", { class: "empty", text: "No bulk retry yet." })));
      return;
    }
    const now = Date.now();
    for (const o of operations) {
      recent.appendChild(h("tr", { class: `clickable${following === o.id ? " selected" : ""}`, "data-id": o.id, onclick: () => follow(o.id) },
        h("td", { class: "mono", text: o.id }),
        h("td", {}, badge(o.status)),
        h("td", { class: "num", text: `${o.released + o.skipped + o.failed}/${o.total}` }),
        h("td", { text: o.requested_by || "" }),
        h("td", { class: "nowrap muted", title: o.created_at, text: relTime(o.created_at, now) })));
    }
  }

  function destroy() {
    following = null;
    clearTimeout(timer);
  }

  return { el, refresh, destroy };
}

// parseRate reads "5" or "5/s", as retryd jobs bulk-retry --rate does;
// empty leaves the API's default.
export function parseRate(v) {
  if (!v) return undefined;
  const n = Number(v.replace(/\/s$/, "").trim());
  if (!(n > 0 && n <= 1000)) throw new Error(`Release rate "${v}": jobs per second above 0 and at most 1000, such as 5 or 5/s.`);
  return n;
}
