// The jobs view: the jobs retryd gave up on, which need an operator; a
// filtered list of every job; for the selected one its attempts, what
// decided each and which worker instance ran it. The bulk retry panel is
// jobs-bulk.js.

import { api } from "./api.js";
import { h, clear, badge, classTag, relTime, stamp, clock, fmtMS, trunc } from "./dom.js";
import { actionDialog, toast } from "./dialog.js";
import * as bulk from "./jobs-bulk.js";
import * as list from "./list.js";

export const STATUSES = ["retrying", "held", "in_progress", "failed_max_retries", "failed", "cancelled", "completed"];
export const CLASSES = ["timeout", "rate_limit", "network", "temporary", "validation", "authentication", "permission", "unknown"];
// The API's alias for failed and failed_max_retries: a non-retryable error
// or a spent budget. Cancelled jobs are left out: an operator stopped them.
export const GIVEN_UP = "permanently_failed";
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
  const tbody = h("tbody");
  const attention = h("tbody");
  const attentionCount = h("span", { class: "count", "data-test": "attention-count" });
  const detail = h("section", { class: "panel detail", "data-test": "job-detail", hidden: true });
  const filters = list.filters("jobs", "job", go);
  // Up to the API's 1000 a page.
  const jobs = list.pages({ view: "jobs", noun: "job", max: 1000, limit: () => p.limit,
    fetch: async (limit, cursor) => {
      const page = await api.listJobs({ job_type: p.job_type, status: p.status, priority: p.priority, error_class: p.error_class, limit, cursor });
      return { rows: page.jobs, next_cursor: page.next_cursor };
    },
    shown: (rows) => drawRows(tbody, rows, "No jobs match these filters.") });
  const bulkPanel = bulk.panel({ statuses: STATUSES, classes: CLASSES, givenUp: GIVEN_UP });
  const layout = h("div", { class: "split jobs" },
    list.panel("jobs", jobs, COLUMNS, tbody,
      filters.input("job_type", "Job type", "e.g. send_email"),
      filters.select("status", "Status", list.options("any status", STATUSES, [[GIVEN_UP, "failed or failed_max_retries"]])),
      filters.select("priority", "Priority", list.options("any priority", PRIORITIES)),
      filters.select("error_class", "Last error class", list.options("any class", CLASSES))),
    detail);
  root.appendChild(h("div", { class: "stack" },
    h("div", { class: "grid2" },
      h("section", { class: "panel", "data-test": "jobs-attention" },
        h("div", { class: "panel-head" }, h("h2", { text: "Needs attention" }), attentionCount),
        h("div", { class: "table-wrap" }, h("table", {}, list.head(COLUMNS), attention))),
      bulkPanel.el),
    layout));
  filters.sync(p);

  async function loadAttention() {
    const page = await api.listJobs({ status: GIVEN_UP, limit: ATTENTION });
    attentionCount.textContent = page.jobs.length
      ? `${page.jobs.length}${page.next_cursor ? "+" : ""} failed, newest first` : "";
    drawRows(attention, page.jobs, "No failed job needs an operator.");
  }

  function drawRows(body, rows, empty) {
    list.drawRows(body, rows, COLUMNS, empty, (j, now) =>
      list.itemRow(j, p.job, (id) => go({ job: id }),
        // A ULID's time part and a little more: enough to tell jobs apart.
        list.idCell(j.id, 10),
        h("td", { class: "mono", text: j.job_type }),
        h("td", {}, badge(j.status)),
        h("td", { class: `priority ${j.priority || "normal"}`, "data-test": "priority", text: j.priority || "normal" }),
        h("td", { class: "num", text: `${j.retry_count}/${j.max_retries ?? "–"}` }),
        h("td", { class: "lasterr", title: j.last_error_message || "" }, classTag(j.last_error_class)),
        h("td", { class: "nowrap muted", title: j.updated_at, text: relTime(j.updated_at, now) })));
  }

  const loadDetail = () => list.loadDetail(layout, detail, "job", () => p.job, api.getJob, (view) => drawDetail(p.job, view));

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
    await Promise.all([jobs.load(false), loadAttention(), loadDetail(), bulkPanel.refresh()]);
  }

  await refresh();
  return {
    refresh,
    destroy: bulkPanel.destroy,
    async update(params) {
      const listChanged = filters.moved(FILTERS, params, p);
      p = { ...params };
      if (listChanged) {
        jobs.reset();
        await Promise.all([jobs.load(false), loadDetail()]);
        return;
      }
      drawRows(tbody, jobs.rows(), "No jobs match these filters.");
      await Promise.all([loadAttention(), loadDetail()]);
    },
  };
}

function facts(j, now) {
  const kv = list.kv;
  const at = (iso) => stamp(iso, now);
  return [
    kv("Status", j.status_reason ? `${j.status} (${j.status_reason})` : j.status),
    kv("Priority", j.priority || "normal"),
    kv("Attempt", String(j.attempt)),
    kv("Retries used", list.retriesUsed(j)),
    j.current_step ? kv("Current step", j.current_step) : null,
    j.last_error_class || j.last_error_message ? kv("Last error", list.lastError(j)) : null,
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
