// The jobs view: the jobs retryd gave up on, which need an operator; a
// filtered list of every job; for the selected one its attempts, what
// decided each and which worker instance ran it. The bulk retry panel is
// jobs-bulk.js.

import { api } from "./api.js";
import { h, clear, badge, classTag, relTime, dateTime, clock, fmtMS, trunc } from "./dom.js";
import { actionDialog, toast } from "./dialog.js";
import * as bulk from "./jobs-bulk.js";

export const STATUSES = ["retrying", "held", "in_progress", "failed_max_retries", "failed", "cancelled", "completed"];
export const CLASSES = ["timeout", "rate_limit", "network", "temporary", "validation", "authentication", "permission", "unknown"];
// The API's alias for failed and failed_max_retries: a non-retryable error
// or a spent budget. Cancelled jobs are left out: an operator stopped them.
export const GIVEN_UP = "permanently_failed";
const PAGE = 100;
const ATTENTION = 20;
// Statuses with a pending retry to cancel; the API answers 409 for the rest.
const PENDING = new Set(["retrying", "held", "in_progress"]);
// Priority bands, highest first (jobs.<job_type>.high, jobs.<job_type>,
// jobs.<job_type>.low).
export const PRIORITIES = ["high", "normal", "low"];
const FILTERS = ["job_type", "status", "priority", "error_class"];
const COLUMNS = ["ID", "Type", "Status", "Priority", "Retries", "Last error", "Updated"];

export async function render(root, params, { navigate }) {
  let p = { ...params };
  const go = (patch) => navigate("jobs", { ...p, ...patch });
  const list = h("tbody");
  const attention = h("tbody");
  const count = h("span", { class: "count", "data-test": "jobs-count" });
  const attentionCount = h("span", { class: "count", "data-test": "attention-count" });
  const more = h("button", { class: "small", "data-test": "jobs-more", hidden: true, text: "More", onclick: () => load(true).catch((e) => toast(e.message, true)) });
  const detail = h("section", { class: "panel detail", "data-test": "job-detail", hidden: true });
  const controls = {};
  let rows = [];
  let cursor = "";

  const filterSelect = (name, label, options) => {
    controls[name] = h("select", { name, "data-test": `jobs-filter-${name}`, onchange: (e) => go({ [name]: e.target.value, job: "" }) },
      options.map(([v, text]) => h("option", { value: v, text })));
    return h("label", {}, label, controls[name]);
  };
  const statusOptions = [["", "any status"], [GIVEN_UP, "failed or failed_max_retries"], ...STATUSES.map((s) => [s, s])];
  const bulkPanel = bulk.panel({ statuses: STATUSES, classes: CLASSES, givenUp: GIVEN_UP });
  const layout = h("div", { class: "split jobs" },
    h("section", { class: "panel", "data-test": "jobs-list" },
      h("div", { class: "filters" },
        h("label", {}, "Job type", (controls.job_type = h("input", { name: "job_type", "data-test": "jobs-filter-job_type", placeholder: "e.g. send_email",
          onchange: (e) => go({ job_type: e.target.value.trim(), job: "" }) }))),
        filterSelect("status", "Status", statusOptions),
        filterSelect("priority", "Priority", [["", "any priority"], ...PRIORITIES.map((v) => [v, v])]),
        filterSelect("error_class", "Last error class", [["", "any class"], ...CLASSES.map((c) => [c, c])]),
        count),
      h("div", { class: "table-wrap" }, h("table", {}, head(), list)),
      h("div", { class: "panel-body", style: { "text-align": "center" } }, more)),
    detail);
  root.appendChild(h("div", { class: "stack" },
    h("div", { class: "grid2" },
      h("section", { class: "panel", "data-test": "jobs-attention" },
        h("div", { class: "panel-head" }, h("h2", { text: "Needs attention" }), attentionCount),
        h("div", { class: "table-wrap" }, h("table", {}, head(), attention))),
      bulkPanel.el),
    layout));
  syncControls();

  // syncControls shows the filters of the hash, which the back button
  // changes too; a class the list does not know is added to it.
  function syncControls() {
    for (const k of FILTERS) {
      const el = controls[k];
      const v = p[k] || "";
      if (el.tagName === "SELECT" && ![...el.options].some((o) => o.value === v)) el.appendChild(h("option", { value: v, text: v }));
      el.value = v;
    }
  }

  // pageSize: ?limit= of the hash, else PAGE.
  const pageSize = () => Math.min(Math.max(Number(p.limit) || PAGE, 1), 1000);

  // Loads run one after another, so the last one asked for is the one
  // shown: a filter changed twice, "More" during a refresh.
  let loading = Promise.resolve();
  function load(append = false) {
    const next = loading.then(() => loadPage(append));
    loading = next.catch(() => {});
    return next;
  }

  async function loadPage(append) {
    // A refresh reads as many jobs as are shown, so the pages "More"
    // added stay (up to the API's 1000).
    const limit = append ? pageSize() : Math.min(Math.max(rows.length, pageSize()), 1000);
    const page = await api.listJobs({ job_type: p.job_type, status: p.status, priority: p.priority, error_class: p.error_class, limit, cursor: append ? cursor : "" });
    rows = append ? rows.concat(page.jobs) : page.jobs;
    cursor = page.next_cursor || "";
    more.hidden = !cursor;
    count.textContent = `${rows.length}${cursor ? "+" : ""} ${rows.length === 1 ? "job" : "jobs"}`;
    drawRows(list, rows, "No jobs match these filters.");
  }

  async function loadAttention() {
    const page = await api.listJobs({ status: GIVEN_UP, limit: ATTENTION });
    attentionCount.textContent = page.jobs.length
      ? `${page.jobs.length}${page.next_cursor ? "+" : ""} failed, newest first` : "";
    drawRows(attention, page.jobs, "No failed job needs an operator.");
  }

  function drawRows(tbody, jobs, empty) {
    clear(tbody);
    if (!jobs.length) {
      tbody.appendChild(h("tr", {}, h("td", { colspan: COLUMNS.length, class: "empty", text: empty })));
      return;
    }
    const now = Date.now();
    for (const j of jobs) {
      tbody.appendChild(h("tr", { class: `clickable${p.job === j.id ? " selected" : ""}`, "data-id": j.id, "data-status": j.status,
        onclick: () => go({ job: j.id }) },
        h("td", { class: "id", title: j.id, text: shortID(j.id) }),
        h("td", { class: "mono", text: j.job_type }),
        h("td", {}, badge(j.status)),
        h("td", { class: `priority ${j.priority || "normal"}`, "data-test": "priority", text: j.priority || "normal" }),
        h("td", { class: "num", text: `${j.retry_count}/${j.max_retries ?? "–"}` }),
        h("td", { class: "lasterr", title: j.last_error_message || "" }, classTag(j.last_error_class)),
        h("td", { class: "nowrap muted", title: j.updated_at, text: relTime(j.updated_at, now) })));
    }
  }

  async function loadDetail() {
    layout.classList.toggle("with-detail", !!p.job);
    detail.hidden = !p.job;
    if (!p.job) return;
    let view;
    try {
      view = await api.getJob(p.job);
    } catch (e) {
      clear(detail).appendChild(h("div", { class: "panel-body" }, h("p", { class: "err", text: e.status === 404 ? `No job ${p.job}.` : e.message })));
      return;
    }
    drawDetail(p.job, view);
  }

  function drawDetail(id, { job: j, history }) {
    const now = Date.now();
    const status = j?.status;
    clear(detail).append(
      h("div", { class: "panel-head" },
        h("div", {}, h("h2", { text: `job / ${id}` }), h("div", { class: "muted", text: j ? `job type ${j.job_type}` : "" })),
        status ? h("span", { "data-test": "job-status", "data-status": status, style: { "margin-left": "auto" } }, badge(status)) : null,
        h("button", { class: "small", title: "Close", onclick: () => go({ job: "" }), text: "✕" })),
      h("div", { class: "panel-body stack" },
        h("div", { class: "actions" },
          !status || PENDING.has(status) ? h("button", { class: "danger needs-operator", "data-test": "job-cancel", onclick: () => cancel(id), text: "Cancel" }) : null,
          h("button", { class: "primary needs-operator", "data-test": "job-retry", onclick: () => retry(id), text: "Retry" })),
        j ? h("dl", { class: "kv", "data-test": "job-facts" }, facts(j, now))
          // The scheduler writes the history before the projection folds
          // the job, so a fresh job can have history and no row yet.
          : h("p", { class: "muted", text: "Not in the jobs table yet; its history so far:" }),
        h("h3", { text: `Attempts (${history.length} events)`, style: { "font-size": "14px" } }),
        history.length ? h("div", { class: "table-wrap" }, h("table", { class: "history", "data-test": "job-history" },
          h("thead", {}, h("tr", {}, ["Time", "Attempt", "Event", "Error class", "Message", "Delay", "Decided by", "Executor"].map((t) => h("th", { text: t })))),
          h("tbody", {}, history.map(historyRow))))
          : h("p", { class: "muted", text: "No history: the job never failed." }),
        h("p", { class: "hint" }, "From the terminal: ", h("code", { text: `retryd jobs show ${id}` }))));
  }

  async function retry(id) {
    const done = await actionDialog({
      title: `Retry job ${trunc(id, 26)} now?`,
      message: "A new attempt is scheduled now, recorded as decided_by manual.",
      confirm: "Retry",
      fields: [{ name: "reason", label: "Reason", placeholder: "e.g. upstream fixed" }],
      action: (v) => api.retryJob(id, v.reason),
    });
    // The status follows once the jobs projection folds the decision.
    if (done) { toast(`Retrying job ${id}`); await refresh(); }
  }

  async function cancel(id) {
    const done = await actionDialog({
      title: `Cancel job ${trunc(id, 26)}?`,
      message: "Its pending retry is cancelled. You can still retry it by hand later.",
      confirm: "Cancel job", danger: true,
      fields: [{ name: "reason", label: "Reason (recorded in the history)", placeholder: "e.g. customer left" }],
      action: (v) => api.cancelJob(id, v.reason),
    });
    if (done) { toast(`Cancelled job ${id}`); await refresh(); }
  }

  async function refresh() {
    await Promise.all([load(false), loadAttention(), loadDetail(), bulkPanel.refresh()]);
  }

  await refresh();
  return {
    refresh,
    destroy: bulkPanel.destroy,
    async update(params) {
      const next = { ...params };
      const listChanged = [...FILTERS, "limit"].some((k) => (next[k] || "") !== (p[k] || ""));
      p = next;
      syncControls();
      if (listChanged) {
        rows = [];
        await Promise.all([load(false), loadDetail()]);
        return;
      }
      drawRows(list, rows, "No jobs match these filters.");
      await Promise.all([loadAttention(), loadDetail()]);
    },
  };
}

function head() {
  return h("thead", {}, h("tr", {}, COLUMNS.map((t) => h("th", { text: t }))));
}

// shortID keeps a ULID's time part and a little more: enough to tell jobs
// apart in a list; the full id is the row's title.
function shortID(id) {
  return id.length > 12 ? id.slice(0, 10) + "…" : id;
}

function kv(k, v) {
  return [h("dt", { text: k }), h("dd", { text: v })];
}

// A manual retry without a reset may go past the budget; "3 of 2" would
// read as a counting error.
function retriesUsed(j) {
  if (j.max_retries === null || j.max_retries === undefined) return String(j.retry_count);
  const used = j.retry_count > j.max_retries ? `${j.retry_count}, over the ${j.max_retries} allowed` : `${j.retry_count} of ${j.max_retries}`;
  return j.retry_enabled ? used : `${used} (retries disabled)`;
}

function facts(j, now) {
  const at = (iso) => `${dateTime(iso)} (${relTime(iso, now)})`;
  return [
    kv("Status", j.status_reason ? `${j.status} (${j.status_reason})` : j.status),
    kv("Priority", j.priority || "normal"),
    kv("Attempt", String(j.attempt)),
    kv("Retries used", retriesUsed(j)),
    j.current_step ? kv("Current step", j.current_step) : null,
    j.last_error_class || j.last_error_message ? kv("Last error", [j.last_error_class, j.last_error_message].filter(Boolean).join(": ")) : null,
    j.next_retry_at && PENDING.has(j.status) ? kv("Next retry", at(j.next_retry_at)) : null,
    kv("Created", at(j.created_at)),
    kv("Updated", at(j.updated_at)),
    j.completed_at ? kv("Completed", at(j.completed_at)) : null,
  ];
}

function detailOf(e) {
  if (!e.detail) return {};
  return typeof e.detail === "string" ? JSON.parse(e.detail) : e.detail;
}

// note is an entry's message: the error of a failure, else what its
// detail says (a decision's note, base delay and retry budget, a hold's
// detail, a cancel's reason and who), much as retryd jobs show prints it.
function note(e) {
  if (e.error_message) return e.error_message;
  const d = detailOf(e);
  return [
    d.hold_reason && `held: ${d.hold_reason}`, d.note, d.detail, d.reason, d.by && `by ${d.by}`,
    d.base_delay_ms !== undefined && `base ${fmtMS(d.base_delay_ms)}`,
    d.retry_count !== undefined && d.max_retries !== undefined && `retries used ${d.retry_count} of ${d.max_retries}`,
  ].filter(Boolean).join("; ");
}

function historyRow(e) {
  const msg = note(e);
  return h("tr", { "data-event": e.event, "data-attempt": e.attempt },
    h("td", { class: "nowrap muted", title: e.at, text: clock(e.at) }),
    h("td", { class: "num", text: e.attempt }),
    h("td", { text: e.event }),
    h("td", {}, classTag(e.error_class)),
    h("td", { class: e.error_message ? "msg err" : "msg", title: msg, text: trunc(msg, 120) }),
    h("td", { class: "nowrap", text: e.delay_ms === undefined || e.delay_ms === null ? "" : fmtMS(e.delay_ms) }),
    h("td", { text: e.decided_by || "" }),
    h("td", { class: "mono nowrap", "data-test": "executor", text: e.executor || "" }));
}
