// The runs view: the workflow runs triggers launched, filtered by
// workflow, status and last error class (kept in the address), and for
// the selected one its retry state and its steps: which node ran how many
// times, on which executor, with what error or output. A run that failed
// is retried by hand through the scheduler (kind run), like any item.

import { api } from "./api.js";
import { h, clear, badge, classTag, relTime, stamp, trunc } from "./dom.js";
import { actionDialog, toast } from "./dialog.js";
import { CLASSES } from "./jobs.js";
import * as list from "./list.js";

export const STATUSES = ["requested", "in_progress", "retrying", "failed_max_retries", "failed", "completed"];
// The API's alias for failed and failed_max_retries, as on the jobs view.
const GIVEN_UP = "permanently_failed";
// Statuses of a run that failed: only those have a retry at the
// scheduler, so only those are offered one.
const RETRYABLE = new Set(["retrying", "failed", "failed_max_retries"]);
const FILTERS = ["workflow", "status", "error_class"];
const COLUMNS = ["ID", "Workflow", "Status", "Attempt", "Retries", "Node", "Last error", "Requested"];

export async function render(root, params, { navigate }) {
  let p = { ...params };
  const go = (patch) => navigate("runs", { ...p, ...patch });
  const tbody = h("tbody");
  const detail = h("section", { class: "panel detail", "data-test": "run-detail", hidden: true });
  const filters = list.filters("runs", "run", go);
  // Up to the API's 500 a page.
  const runs = list.pages({ view: "runs", noun: "run", max: 500, limit: () => p.limit,
    fetch: async (limit, cursor) => {
      const page = await api.listRuns({ workflow: p.workflow, status: p.status, error_class: p.error_class, limit, cursor });
      return { rows: page.runs, next_cursor: page.next_cursor };
    },
    shown: drawRows });
  const layout = h("div", { class: "split runs" },
    list.panel("runs", runs, COLUMNS, tbody,
      filters.input("workflow", "Workflow", "e.g. onboard"),
      filters.select("status", "Status", list.options("any status", STATUSES, [[GIVEN_UP, "failed or failed_max_retries"]])),
      filters.select("error_class", "Last error class", list.options("any class", CLASSES))),
    detail);
  root.appendChild(layout);
  filters.sync(p);

  function drawRows(rows) {
    list.drawRows(tbody, rows, COLUMNS, "No runs match these filters.", (r, now) =>
      list.itemRow(r, p.run, (id) => go({ run: id }),
        // Run ids are "run-" and a ULID: keep its time part and a little more.
        list.idCell(r.id, 14),
        h("td", { class: "mono", text: r.workflow }),
        h("td", {}, badge(r.status)),
        h("td", { class: "num", text: String(r.attempt) }),
        h("td", { class: "num", text: `${r.retry_count}/${r.max_retries ?? "–"}` }),
        h("td", { class: "mono", text: r.current_node_id || "" }),
        h("td", { class: "lasterr", title: r.last_error_message || "" }, classTag(r.last_error_class)),
        h("td", { class: "nowrap muted", title: r.requested_at, text: relTime(r.requested_at, now) })));
  }

  const loadDetail = () => list.loadDetail(layout, detail, "run", () => p.run, api.getRun, drawDetail);

  function drawDetail({ run: r, steps }) {
    const now = Date.now();
    clear(detail).append(
      h("div", { class: "panel-head" },
        h("div", {}, h("h2", { text: `run / ${r.id}` }), h("div", { class: "muted", text: `workflow ${r.workflow}` })),
        h("span", { "data-test": "run-status", "data-status": r.status, style: { "margin-left": "auto" } }, badge(r.status)),
        h("button", { class: "small", title: "Close", onclick: () => go({ run: "" }), text: "✕" })),
      h("div", { class: "panel-body stack" },
        RETRYABLE.has(r.status) ? h("div", { class: "actions" },
          h("button", { class: "primary needs-operator", "data-test": "run-retry", onclick: () => retry(r.id), text: "Retry" })) : null,
        h("dl", { class: "kv", "data-test": "run-facts" }, facts(r, now)),
        h("h3", { text: `Steps (${steps.length})`, style: { "font-size": "14px" } }),
        steps.length ? h("div", { class: "table-wrap" }, h("table", { class: "history", "data-test": "run-steps" },
          h("thead", {}, h("tr", {}, ["Node", "Status", "Attempts", "Retry", "Error", "Executor", "Output"].map((t) => h("th", { text: t })))),
          h("tbody", {}, steps.map((s) => stepRow(s, now)))))
          : h("p", { class: "muted", text: "No step reported yet." }),
        // The scheduler's decisions (why it retried, when, by whom) are
        // the retry of kind run on the Retries tab; a run that never
        // failed has none.
        RETRYABLE.has(r.status) || r.retry_count > 0
          ? h("p", { class: "hint" }, "Why it retried: ",
            h("a", { href: `#/retries?kind=run&item=${encodeURIComponent(`run/${r.id}`)}`, "data-test": "run-retry-history", text: "its retry timeline" }))
          : null,
        h("p", { class: "hint" }, "From the terminal: ", h("code", { text: `retryd runs show ${r.id}` }))));
  }

  async function retry(id) {
    const done = await actionDialog({
      title: `Retry run ${trunc(id, 30)} now?`,
      message: "The run comes back now from its last completed node, recorded as decided_by manual.",
      confirm: "Retry",
      fields: [{ name: "reason", label: "Reason", placeholder: "e.g. crm back up" }],
      action: async (v) => {
        try {
          return await api.retryNow("run", id, v.reason);
        } catch (e) {
          // The scheduler has a retry of a run only once it failed.
          if (e.status === 404) throw new Error(`Run ${id} has no retry at the scheduler: only a run that failed can be retried.`);
          throw e;
        }
      },
    });
    // The status follows once the triggers service applies the due retry.
    if (done) { toast(`Retrying run ${id}`); await refresh(); }
  }

  async function refresh() {
    await Promise.all([runs.load(false), loadDetail()]);
  }

  await refresh();
  return {
    refresh,
    async update(params) {
      const listChanged = filters.moved(FILTERS, params, p);
      p = { ...params };
      if (listChanged) {
        runs.reset();
        await refresh();
        return;
      }
      drawRows(runs.rows());
      await loadDetail();
    },
  };
}

function facts(r, now) {
  const kv = list.kv;
  const at = (iso) => stamp(iso, now);
  return [
    kv("Status", r.status),
    kv("Attempt", String(r.attempt), "run-attempt"),
    kv("Retries used", list.retriesUsed(r), "run-retries"),
    r.next_retry_at && r.status === "retrying" ? kv("Next retry", at(r.next_retry_at), "run-next-retry") : null,
    r.current_node_id ? kv("Current node", r.current_node_id) : null,
    r.last_error_class || r.last_error_message
      ? kv("Last error", list.lastError(r), "run-last-error") : null,
    r.last_error_timestamp ? kv("Last error at", at(r.last_error_timestamp)) : null,
    r.error ? kv("Error", r.error) : null,
    r.executor ? kv("Executor", r.executor, "run-executor") : null,
    r.trigger_id ? kv("Trigger", r.trigger_id) : null,
    r.delivery_id ? kv("Delivery", r.delivery_id) : null,
    r.event_id ? kv("Event", r.event_id) : null,
    kv("Requested", at(r.requested_at)),
    kv("Updated", at(r.updated_at)),
    r.lease_expires_at && (r.status === "requested" || r.status === "in_progress") ? kv("Lease until", at(r.lease_expires_at)) : null,
    r.finished_at ? kv("Finished", at(r.finished_at)) : null,
  ];
}

function stepRow(s, now) {
  const err = list.lastError(s);
  const out = s.output === undefined || s.output === null ? "" : JSON.stringify(s.output);
  let retry = s.retry_state === "none" ? "" : s.retry_state;
  if (s.retry_state === "scheduled" && s.next_attempt_at) retry += ` ${relTime(s.next_attempt_at, now)}`;
  return h("tr", { "data-node": s.node, "data-status": s.status },
    h("td", { class: "mono", text: s.node }),
    h("td", {}, badge(s.status)),
    h("td", { class: "num", "data-test": "step-attempts", title: `last reported by run attempt ${s.run_attempt}`, text: String(s.attempts) }),
    h("td", { class: "nowrap", "data-test": "step-retry", text: retry }),
    h("td", { class: err ? "msg err" : "msg", "data-test": "step-error", title: err, text: trunc(err, 120) }),
    h("td", { class: "mono nowrap", "data-test": "executor", text: s.executor || "" }),
    h("td", { class: "mono msg", "data-test": "step-output", title: out, text: trunc(out, 80) }));
}
