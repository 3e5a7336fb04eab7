// The retries view: a filtered list of retries and, for the selected one,
// its timeline — every lifecycle event with what decided it.

import { api } from "./api.js";
import { h, clear, badge, classTag, relTime, clock, dateTime, fmtMS, trunc, stateColors } from "./dom.js";
import { actionDialog, toast } from "./dialog.js";

const STATES = [
  ["scheduled", "pending (scheduled)"], ["due", "due (running)"], ["exhausted", "exhausted"],
  ["succeeded", "succeeded"], ["cancelled", "cancelled"], ["any", "any state"],
];
const KINDS = ["", "event", "event-trigger", "job"];
const PAGE = 200;

export async function render(root, params, { navigate }) {
  let p = normalize(params);
  const list = h("tbody");
  const count = h("span", { class: "count" });
  const more = h("button", { class: "small", hidden: true, text: "Load more", onclick: () => load(true) });
  const detail = h("section", { class: "panel detail", "data-test": "detail", hidden: true });
  let cursor = "";
  let rows = [];

  const go = (patch) => navigate("retries", { ...p, ...patch });
  const filterSelect = (name, options, label) =>
    h("label", {}, label, h("select", { name, "data-test": `filter-${name}`, onchange: (e) => go({ [name]: e.target.value, item: "" }) },
      options.map(([v, text]) => h("option", { value: v, text, selected: p[name] === v }))));
  const filterInput = (name, label, placeholder) =>
    h("label", {}, label, h("input", { name, "data-test": `filter-${name}`, placeholder, value: p[name] || "",
      onchange: (e) => go({ [name]: e.target.value.trim(), item: "" }) }));

  const kinds = KINDS.includes(p.kind) ? KINDS : [...KINDS, p.kind];
  const listPanel = h("section", { class: "panel" },
    h("div", { class: "filters" },
      filterSelect("state", STATES, "State"),
      filterSelect("kind", kinds.map((k) => [k, k || "any kind"]), "Kind"),
      filterInput("source", "Source", "e.g. shop"),
      filterInput("job_type", "Job type", "e.g. send_email"),
      count),
    h("div", { class: "table-wrap" }, h("table", {},
      h("thead", {}, h("tr", {}, ["Kind", "ID", "State", "Attempt", "Retries", "Next attempt", "Type / source", "Last error", ""].map((t, i) =>
        h("th", { class: i === 6 || i === 8 ? "wide-only" : "", text: t })))),
      list)),
    h("div", { class: "panel-body", style: { "text-align": "center" } }, more));
  const layout = h("div", { class: "split" }, listPanel, detail);
  root.appendChild(layout);

  function query() {
    return { kind: p.kind, state: p.state === "any" ? "" : p.state, source: p.source, job_type: p.job_type, limit: PAGE };
  }

  async function load(append = false) {
    const page = await api.listRetries({ ...query(), cursor: append ? cursor : "" });
    rows = append ? rows.concat(page.retries) : page.retries;
    cursor = page.next_cursor || "";
    more.hidden = !cursor;
    drawList();
  }

  function drawList() {
    clear(list);
    count.textContent = `${rows.length}${cursor ? "+" : ""} ${rows.length === 1 ? "retry" : "retries"}`;
    if (!rows.length) {
      list.appendChild(h("tr", {}, h("td", { colspan: 9, class: "empty", text: "No retries match these filters." })));
      return;
    }
    const now = Date.now();
    for (const r of rows) {
      const key = `${r.kind}/${r.id}`;
      const pending = r.state === "scheduled" || r.state === "due";
      list.appendChild(h("tr", { class: `clickable${p.item === key ? " selected" : ""}`, "data-id": r.id, "data-kind": r.kind, "data-state": r.state,
        onclick: () => go({ item: key }) },
        h("td", { text: r.kind }),
        h("td", { class: "id", title: r.id, text: trunc(r.id, 28) }),
        h("td", {}, badge(r.state)),
        h("td", { class: "num", text: r.attempt }),
        h("td", { class: "num", text: `${r.retry_count}/${r.max_retries}` }),
        h("td", { class: "nowrap", text: pending ? relTime(r.next_attempt_at, now) : "" }),
        h("td", { class: "wide-only", text: [r.job_type, r.source].filter(Boolean).join(" · ") }),
        h("td", { class: "lasterr", title: r.last_error_message || r.last_reason || "" },
          classTag(r.last_error_class), " ", h("span", { class: "err", text: trunc(r.last_error_message || r.last_reason || "", 60) })),
        h("td", { class: "wide-only" }, h("div", { class: "actions nowrap" },
          pending ? h("button", { class: "small danger", "data-test": "row-cancel", onclick: (e) => { e.stopPropagation(); cancel(r); }, text: "Cancel" }) : null,
          h("button", { class: "small", "data-test": "row-retry", onclick: (e) => { e.stopPropagation(); retryNow(r); }, text: "Retry now" })))));
    }
  }

  async function loadDetail() {
    if (!p.item) {
      detail.hidden = true;
      layout.classList.remove("with-detail");
      return;
    }
    const [kind, ...rest] = p.item.split("/");
    const id = rest.join("/");
    let view;
    try {
      view = await api.getRetry(kind, id);
    } catch (e) {
      detail.hidden = false;
      layout.classList.add("with-detail");
      clear(detail).appendChild(h("div", { class: "panel-body" }, h("p", { class: "err", text: e.status === 404 ? `No retry ${p.item}.` : e.message })));
      return;
    }
    detail.hidden = false;
    layout.classList.add("with-detail");
    drawDetail(view);
  }

  function drawDetail({ retry: r, history = [] }) {
    const pending = r.state === "scheduled" || r.state === "due";
    const now = Date.now();
    clear(detail).append(
      h("div", { class: "panel-head" },
        h("div", {}, h("h2", { text: `${r.kind} / ${r.id}` }),
          h("div", { class: "muted", text: [r.job_type && `job type ${r.job_type}`, r.source && `source ${r.source}`].filter(Boolean).join(" · ") })),
        h("span", { "data-test": "detail-state", "data-state": r.state, style: { "margin-left": "auto" } }, badge(r.state)),
        h("button", { class: "small", title: "Close", onclick: () => go({ item: "" }), text: "✕" })),
      h("div", { class: "panel-body stack" },
        h("div", { class: "actions" },
          pending ? h("button", { class: "danger", "data-test": "cancel", onclick: () => cancel(r), text: "Cancel retry" }) : null,
          h("button", { class: "primary", "data-test": "retry", onclick: () => retryNow(r), text: "Retry now" }),
          r.source ? h("button", { "data-test": "pause-source", onclick: () => pauseSource(r.source), text: `Pause source ${r.source}` }) : null),
        h("div", { class: "why", "data-test": "why" }, h("b", { text: "Why? " }), why(r, history, now)),
        h("dl", { class: "kv" },
          kv("Attempt", `${r.attempt} (retries used ${retriesUsed(r.retry_count, r.max_retries)}${r.retry_enabled ? "" : ", retries disabled"})`),
          kv("Policy", r.policy_name ? `${r.policy_name} v${r.policy_version}` : "–"),
          pending ? kv("Next attempt", r.next_attempt_at ? `${dateTime(r.next_attempt_at)} (${relTime(r.next_attempt_at, now)})` : "–") : null,
          r.last_error_class || r.last_error_message ? kv("Last error", `${r.last_error_class || "?"}: ${r.last_error_message || ""}`) : null,
          r.exhausted_reason ? kv("Exhausted", r.exhausted_reason.replaceAll("_", " ")) : null,
          kv("Created", dateTime(r.created_at)),
          kv("Updated", `${dateTime(r.updated_at)} (${relTime(r.updated_at, now)})`)),
        h("h3", { text: `Lifecycle (${history.length})`, style: { "font-size": "14px" } }),
        h("ol", { class: "timeline", "data-test": "timeline" }, history.map(timelineItem)),
        h("p", { class: "hint" }, "From the terminal: ", h("code", { text: `nats stream view RETRIES --subject 'retry.${r.kind}.*.${r.id}'` }),
          " or ", h("code", { text: `retryd retries show ${r.kind} ${r.id}` }))));
  }

  async function cancel(r) {
    const done = await actionDialog({
      title: `Cancel ${r.kind} / ${trunc(r.id, 26)}?`,
      message: "No due event follows; the owner is told through retry.…cancelled. You can still retry it by hand later.",
      confirm: "Cancel retry", danger: true,
      fields: [{ name: "reason", label: "Reason (recorded in the lifecycle)", placeholder: "e.g. customer deleted" }],
      action: (v) => api.cancelRetry(r.kind, r.id, v.reason),
    });
    if (done) { toast(`Cancelled ${r.kind}/${r.id}`); await refresh(); }
  }

  async function retryNow(r) {
    const done = await actionDialog({
      title: `Retry ${r.kind} / ${trunc(r.id, 26)} now?`,
      message: `A new attempt (${r.attempt + 1}) is scheduled now, decided_by manual.`,
      confirm: "Retry now",
      fields: [{ name: "reason", label: "Reason", placeholder: "e.g. upstream fixed" }],
      action: (v) => api.retryNow(r.kind, r.id, v.reason, false),
    });
    if (done) { toast(`Retrying ${r.kind}/${r.id}`); await refresh(); }
  }

  async function pauseSource(source) {
    const done = await actionDialog({
      title: `Pause source ${source}?`,
      message: "New events of this source are deferred, not dropped, until you resume it.",
      confirm: "Pause",
      fields: [{ name: "reason", label: "Reason", placeholder: "e.g. partner maintenance" }],
      action: (v) => api.pauseSource(source, v.reason),
    });
    if (done) toast(`Paused ${source}`);
  }

  async function refresh() {
    await Promise.all([load(false), loadDetail()]);
  }

  await refresh();
  return {
    refresh,
    async update(params) {
      const next = normalize(params);
      const listChanged = ["state", "kind", "source", "job_type"].some((k) => (next[k] || "") !== (p[k] || ""));
      if (listChanged) {
        clear(root);
        Object.assign(this, await render(root, params, { navigate }));
        return;
      }
      p = next;
      drawList();
      await loadDetail();
    },
  };
}

function normalize(params) {
  const p = { ...params };
  if (!p.state) p.state = "scheduled";
  return p;
}

// A manual retry without a reset may go past the budget; "3 of 2" would
// read as a counting error.
function retriesUsed(used, allowed) {
  return used > allowed ? `${used}, over the ${allowed} allowed` : `${used} of ${allowed}`;
}

function kv(k, v) {
  return [h("dt", { text: k }), h("dd", { text: v })];
}

function detailOf(e) {
  if (!e.detail) return {};
  return typeof e.detail === "string" ? JSON.parse(e.detail) : e.detail;
}

const decidedBy = {
  backoff: "exponential backoff",
  retry_after: "the error's retry-after hint",
  throttle: "a throttle (the owner held it back)",
  manual: "an operator (manual retry)",
};

// why explains the item's current state in one or two sentences.
function why(r, history, now) {
  const lastOf = (...evs) => [...history].reverse().find((e) => evs.includes(e.event));
  const failed = lastOf("failed");
  const sched = lastOf("scheduled", "rescheduled");
  const failure = failed
    ? `Attempt ${failed.attempt} failed with ${failed.error_class || "an unclassified error"}${failed.error_message ? ` (“${trunc(failed.error_message, 80)}”)` : ""}. `
    : "";
  switch (r.state) {
    case "scheduled": {
      if (!sched) return failure + `Attempt ${r.attempt} runs ${relTime(r.next_attempt_at, now)}.`;
      const d = detailOf(sched);
      const parts = d.base_delay_ms !== undefined ? ` (base ${fmtMS(d.base_delay_ms)}${d.jitter_ms ? `, jitter ${d.jitter_ms > 0 ? "+" : ""}${fmtMS(d.jitter_ms)}` : ""})` : "";
      return failure + `Policy ${sched.policy_name || r.policy_name} v${sched.policy_version || r.policy_version} allows ${r.max_retries} retries (${r.retry_count} used so far); ` +
        `${decidedBy[sched.decided_by] || sched.decided_by} chose a delay of ${fmtMS(sched.delay_ms)}${parts}, so attempt ${r.attempt} runs ${relTime(r.next_attempt_at, now)}.`;
    }
    case "due":
      return failure + `Attempt ${r.attempt} came due ${relTime(r.next_attempt_at, now)}; its owner is running it and reports failed or succeeded.`;
    case "succeeded":
      return `Attempt ${r.attempt} succeeded${r.attempt > 1 ? ` after ${r.attempt - 1} failed attempt${r.attempt > 2 ? "s" : ""}` : ""}.`;
    case "exhausted": {
      const reason = {
        max_retries: `all ${r.max_retries} retries of policy ${r.policy_name} v${r.policy_version} are used`,
        non_retryable: `${r.last_error_class || "this"} errors are not retried`,
        retries_disabled: "retries are disabled for it",
      }[r.exhausted_reason] || r.exhausted_reason;
      return failure + `retryd gave up: ${reason}. Retry it by hand once the cause is fixed.`;
    }
    case "cancelled": {
      const c = lastOf("cancelled");
      const d = c ? detailOf(c) : {};
      return `Cancelled${d.by ? ` by ${d.by}` : ""}${d.reason ? `: ${d.reason}` : ""}. No due event follows.`;
    }
  }
  return "";
}

const titles = {
  failed: (e) => `Attempt ${e.attempt} failed`,
  scheduled: (e) => `Retry scheduled: attempt ${e.attempt}`,
  rescheduled: (e) => `Rescheduled: attempt ${e.attempt}`,
  due: (e) => `Attempt ${e.attempt} due`,
  succeeded: (e) => `Attempt ${e.attempt} succeeded`,
  exhausted: (e) => `Exhausted after attempt ${e.attempt}`,
  cancelled: () => "Cancelled",
};

function timelineItem(e) {
  const d = detailOf(e);
  const meta = [];
  if (e.event === "scheduled" || e.event === "rescheduled") {
    if (e.decided_by) meta.push(`decided by ${e.decided_by.replace("_", "-")}`);
    if (e.delay_ms !== undefined && e.delay_ms !== null) {
      let delay = `delay ${fmtMS(e.delay_ms)}`;
      if (d.base_delay_ms !== undefined) delay += ` (base ${fmtMS(d.base_delay_ms)}${d.jitter_ms ? `, jitter ${d.jitter_ms > 0 ? "+" : ""}${fmtMS(d.jitter_ms)}` : ""})`;
      meta.push(delay);
    }
    if (d.retry_after_ms) meta.push(`retry-after ${fmtMS(d.retry_after_ms)}`);
    if (d.retry_count !== undefined) meta.push(`retry ${d.retry_count} of ${d.max_retries}`);
    if (e.next_attempt_at) meta.push(`runs at ${clock(e.next_attempt_at)}`);
    if (d.note) meta.push(d.note);
  }
  if (e.event === "failed" && d.reason) meta.push(`reason ${d.reason}`);
  if (e.event === "due" && d.emission > 1) meta.push(`emitted ${d.emission} times`);
  if (e.event === "exhausted") meta.push(`reason ${(d.reason || "").replaceAll("_", " ")}`, `retries used ${retriesUsed(d.retry_count, d.max_retries)}`);
  if (e.event === "cancelled") meta.push([d.by && `by ${d.by}`, d.reason].filter(Boolean).join(": "));
  if (e.policy_name) meta.push(`policy ${e.policy_name} v${e.policy_version}`);
  return h("li", { "data-event": e.event, style: { "--c": stateColors[e.event] || (e.event === "failed" ? "#b91c1c" : "#9ca3af") } },
    h("div", { class: "ev-head" },
      h("span", { class: "ev-title", text: (titles[e.event] || ((x) => x.event))(e) }),
      classTag(e.error_class),
      h("span", { class: "ev-time", title: e.at, text: clock(e.at) })),
    meta.filter(Boolean).length ? h("div", { class: "ev-meta", text: meta.filter(Boolean).join(" · ") }) : null,
    e.error_message ? h("div", { class: "ev-msg", text: e.error_message }) : null);
}
