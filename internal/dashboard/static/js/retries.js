// The retries view: a filtered list of retries and, for the selected one,
// its timeline — every lifecycle event with what decided it.

import { api } from "./api.js";
import { h, clear, badge, classTag, relTime, clock, dateTime, stamp, fmtMS, trunc, stateColors } from "./dom.js";
import { actionDialog, toast } from "./dialog.js";

const STATES = [
  ["scheduled", "pending (scheduled)"], ["due", "due (running)"], ["exhausted", "exhausted"],
  ["succeeded", "succeeded"], ["cancelled", "cancelled"], ["any", "any state"],
];
const KINDS = ["", "event", "event-trigger", "job", "run"];
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
      h("thead", {}, h("tr", {}, ["Kind", "ID", "State", "Attempt", "Retries", "Next attempt", "Type / source", "Last error / hold", ""].map((t, i) =>
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
      // A held item waits for permission, it did not fail: a held badge,
      // when the hold ends, and the hold in place of an error.
      const held = r.held;
      list.appendChild(h("tr", { class: `clickable${p.item === key ? " selected" : ""}`, "data-id": r.id, "data-kind": r.kind, "data-state": r.state,
        "data-held": held ? held.reason : null, onclick: () => go({ item: key }) },
        h("td", { text: r.kind }),
        h("td", { class: "id", title: r.id, text: trunc(r.id, 28) }),
        h("td", {}, badge(held ? "held" : r.state)),
        h("td", { class: "num", text: r.attempt }),
        h("td", { class: "num", text: `${r.retry_count}/${r.max_retries}` }),
        h("td", { class: "nowrap", "data-test": "row-next", text: held ? holdEnd(held, now) : pending ? relTime(r.next_attempt_at, now) : "" }),
        h("td", { class: "wide-only", text: [r.job_type, r.source].filter(Boolean).join(" · ") }),
        held ? h("td", { class: "lasterr", "data-test": "row-hold", title: holdTitle(held) }, h("span", { class: "hold", text: holdLine(held, now) }))
          : holdWasLast(r) ? h("td", { class: "lasterr", "data-test": "row-hold" }, h("span", { class: "hold", text: `held (${r.last_reason}), no error` }))
          : h("td", { class: "lasterr", title: r.last_error_message || r.last_reason || "" },
            classTag(r.last_error_class), " ", h("span", { class: "err", text: trunc(r.last_error_message || r.last_reason || "", 60) })),
        h("td", { class: "wide-only" }, h("div", { class: "actions nowrap" },
          pending ? h("button", { class: "small danger needs-operator", "data-test": "row-cancel", onclick: (e) => { e.stopPropagation(); cancel(r); }, text: "Cancel" }) : null,
          h("button", { class: "small needs-operator", "data-test": "row-retry", onclick: (e) => { e.stopPropagation(); retryNow(r); }, text: "Retry now" })))));
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
    // What the timeline's entries need from the item as a whole.
    const ctx = { holdExpired: r.exhausted_reason === "hold_expired" ? holdExpired(r, history) : "" };
    clear(detail).append(
      h("div", { class: "panel-head" },
        h("div", {}, h("h2", { text: `${r.kind} / ${r.id}` }),
          h("div", { class: "muted", text: [r.job_type && `job type ${r.job_type}`, r.source && `source ${r.source}`].filter(Boolean).join(" · ") })),
        h("span", { "data-test": "detail-state", "data-state": r.state, "data-held": r.held ? r.held.reason : null, style: { "margin-left": "auto" } },
          badge(r.held ? "held" : r.state)),
        h("button", { class: "small", title: "Close", onclick: () => go({ item: "" }), text: "✕" })),
      h("div", { class: "panel-body stack" },
        h("div", { class: "actions" },
          pending ? h("button", { class: "danger needs-operator", "data-test": "cancel", onclick: () => cancel(r), text: "Cancel retry" }) : null,
          h("button", { class: "primary needs-operator", "data-test": "retry", onclick: () => retryNow(r), text: "Retry now" }),
          r.source ? h("button", { class: "needs-operator", "data-test": "pause-source", onclick: () => pauseSource(r.source), text: `Pause source ${r.source}` }) : null),
        h("div", { class: "why", "data-test": "why" }, h("b", { text: "Why? " }), why(r, history, now)),
        h("dl", { class: "kv" },
          kv("Attempt", `${r.attempt} (retries used ${retriesUsed(r.retry_count, r.max_retries)}${r.retry_enabled ? "" : ", retries disabled"})`),
          kv("Policy", r.policy_name ? `${r.policy_name} v${r.policy_version}` : "–"),
          pending && !r.held ? kv("Next attempt", r.next_attempt_at ? stamp(r.next_attempt_at, now) : "–") : null,
          r.held ? kv("Held", heldSummary(r.held, now)) : pending && r.held_since ? kv("Held", `${r.hold_reason || "held"} since ${stamp(r.held_since, now)}; due now, its owner looks at it again`) : null,
          r.held ? kv("Hold ends", r.held.until ? stamp(r.held.until, now) : `until released, at most until ${stamp(r.held.max_hold_at, now)}`) : null,
          r.held && !r.held.until && r.next_attempt_at && Date.parse(r.next_attempt_at) < Date.parse(r.held.max_hold_at)
            ? kv("Next check", `${stamp(r.next_attempt_at, now)}: its owner looks again, and may hold it again`) : null,
          r.last_error_class || r.last_error_message ? kv("Last error", `${r.last_error_class || "?"}: ${r.last_error_message || ""}`) : null,
          r.exhausted_reason ? kv("Exhausted", r.exhausted_reason === "hold_expired" ? `hold expired: ${ctx.holdExpired}` : r.exhausted_reason.replaceAll("_", " ")) : null,
          kv("Created", dateTime(r.created_at)),
          kv("Updated", stamp(r.updated_at, now))),
        h("h3", { text: `Lifecycle (${history.length})`, style: { "font-size": "14px" } }),
        h("ol", { class: "timeline", "data-test": "timeline" }, history.map((e) => timelineItem(e, ctx))),
        h("p", { class: "hint" }, "From the terminal: ", h("code", { text: `retryd streams view RETRIES --subject 'retry.${r.kind}.*.${r.id}'` }),
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

// heldSummary is the item's current hold (the API's held), as `retryd
// retries show` prints it.
function heldSummary(held, now) {
  return `${held.reason} since ${stamp(held.since, now)}${held.key ? `, hold key ${held.key}` : ""}; uses no retry`;
}

// holdEnd says when a hold ends: its end if known, else that it lasts
// until released, at most for what is left of its max_hold (the time a
// next attempt would show, which no attempt waits for).
function holdEnd(held, now) {
  return held.until ? relTime(held.until, now) : `until released (at most ${holdLeft(held, now)})`;
}

// holdLeft is what is left of a hold's max_hold.
function holdLeft(held, now) {
  return fmtMS(Math.max(Date.parse(held.max_hold_at) - now, 0));
}

// holdLine is a held item's list cell where a failed one shows its error.
function holdLine(held, now) {
  return [held.reason, held.key && `key ${held.key}`, `held ${fmtMS(Math.max(now - Date.parse(held.since), 0))}`].filter(Boolean).join(" · ");
}

// holdWasLast reports whether an item's last reason is its last hold's
// (it was held, then admitted, released or exhausted) rather than an
// error's.
function holdWasLast(r) {
  return !r.last_error_class && !r.last_error_message && !!r.last_reason && r.last_reason === r.hold_reason;
}

function holdTitle(held) {
  return `held (${held.reason})${held.key ? ` under hold key ${held.key}` : ""} since ${dateTime(held.since)}; max_hold ${fmtMS(held.max_hold_ms)}, until ${dateTime(held.max_hold_at)}`;
}

function kv(k, v) {
  return [h("dt", { text: k }), h("dd", { text: v })];
}

function detailOf(e) {
  if (!e.detail) return {};
  return typeof e.detail === "string" ? JSON.parse(e.detail) : e.detail;
}

// Decisions that hold an item back rather than retry it: they spend no
// retry, so the why text must not count one. "throttle" is how holds were
// recorded before the held event existed; what those counted is kept as
// recorded.
const HOLD_DECISIONS = new Set(["hold", "pause_until", "pause", "resume"]);
const spendsNoRetry = (e) => HOLD_DECISIONS.has(e.decided_by);
const isHold = (e) => spendsNoRetry(e) || e.decided_by === "throttle";

const holdReasons = {
  throttle: "a rate limit or throttle",
  pause: "a pause",
  concurrency: "a concurrency limit",
};

// releaseCauses names what lifted a hold early, by the release fact's reason.
const releaseCauses = {
  resume: "the source resumed",
  limit_changed: "the limit changed",
  slot_freed: "a slot freed",
};

// releaseCause reads why a resume decision released the item. The
// set-based release writes the fact's reason into the note as
// "released by a release fact (<reason>)" (projections/retrystore/hold.go);
// without it, the hold's own reason tells what most likely lifted.
function releaseCause(d) {
  const m = /\((\w+)\)$/.exec(d.note || "");
  if (m && releaseCauses[m[1]]) return releaseCauses[m[1]];
  if (d.hold_reason === "concurrency") return releaseCauses.slot_freed;
  if (d.hold_reason === "pause") return releaseCauses.resume;
  return "what held it lifted";
}

// explain turns a scheduled or rescheduled history entry into one phrase
// saying what decided it and whether a retry was spent.
const explanations = {
  backoff: (e, d) => `${d.backoff_class ? `the ${d.backoff_class} class's own backoff` : "the policy's exponential backoff"} chose a delay of ${fmtMS(e.delay_ms)}${delayParts(d)}, spending a retry`,
  retry_after: (e, d) => `the error's retry-after hint${d.retry_after_ms != null ? ` of ${fmtMS(d.retry_after_ms)}` : ""} set a delay of ${fmtMS(e.delay_ms)}, spending a retry`,
  hold: (e, d) => `held back by its owner (${holdReasons[d.hold_reason] || "throttle/pause/concurrency"}), no retry spent; ${holdWhen(e, d)}`,
  pause_until: (e, d) => d.capped_by
    ? `held back by its owner: paused, no retry spent; ${holdWhen(e, d)}`
    : `held back by its owner: paused until ${dateTime(e.next_attempt_at)}, no retry spent`,
  pause: () => "held back by its owner: paused without an end, it waits for a resume (or the policy's max_hold), no retry spent",
  resume: (e, d) => `released early: ${releaseCause(d)}, no retry spent`,
  throttle: () => "held back by a throttle (a hold recorded before holds had their own event)",
  manual: () => "an operator retried it by hand",
};

// holdWhen says when a hold is looked at again. A release time past
// max_hold was brought forward to it: then it is not the owner's time.
function holdWhen(e, d) {
  return d.capped_by === "max_hold"
    ? `it is looked at once more at ${dateTime(e.next_attempt_at)}, where its max_hold ends`
    : `it is looked at again at ${dateTime(e.next_attempt_at)}`;
}

function explain(e) {
  const d = detailOf(e);
  const f = explanations[e.decided_by];
  return f ? f(e, d) : `decided by ${e.decided_by || "an unknown rule"}`;
}

// delayParts shows how a backoff delay was made up: base and jitter.
function delayParts(d) {
  if (d.base_delay_ms === undefined) return "";
  return ` (base ${fmtMS(d.base_delay_ms)}${d.jitter_ms ? `, jitter ${d.jitter_ms > 0 ? "+" : ""}${fmtMS(d.jitter_ms)}` : ""})`;
}

const capped = {
  max_retry_after: "the policy's max_retry_after",
  max_hold: "the policy's max_hold",
};

// cappedText says which limit shortened the delay asked for, if one did.
function cappedText(d) {
  if (!d.capped_by) return "";
  const limit = d.capped_by === "max_hold" && d.max_hold_ms ? ` of ${fmtMS(d.max_hold_ms)}` : "";
  return `capped by ${capped[d.capped_by] || d.capped_by}${limit}`;
}

// lastHoldDecision is the newest decision that carried the hold's limit:
// the exhausted entry of a hold_expired item does not repeat it.
function lastHoldDecision(history) {
  return [...history].reverse().map(detailOf).find((d) => d.max_hold_ms !== undefined) || {};
}

// holdExpired says how long the item was held, against which limit.
function holdExpired(r, history) {
  const d = lastHoldDecision(history);
  const since = r.held_since || d.held_since;
  const limit = d.max_hold_ms ? `max_hold ${fmtMS(d.max_hold_ms)}` : "its policy's max_hold";
  return `held longer than ${limit}${since ? ` since ${dateTime(since)}` : ""}`;
}

const sentence = (s) => s.charAt(0).toUpperCase() + s.slice(1);

// why explains the item's current state in one or two sentences.
function why(r, history, now) {
  const lastOf = (...evs) => [...history].reverse().find((e) => evs.includes(e.event));
  const failed = lastOf("failed");
  const failure = failed
    ? `Attempt ${failed.attempt} failed with ${failed.error_class || "an unclassified error"}${failed.error_message ? ` (“${trunc(failed.error_message, 80)}”)` : ""}. `
    : "";
  switch (r.state) {
    case "scheduled":
      return whyScheduled(r, lastOf("scheduled", "rescheduled"), lastOf("held"), failure, now);
    case "due":
      return failure + `Attempt ${r.attempt} came due ${relTime(r.next_attempt_at, now)}; its owner is running it and reports failed or succeeded.`;
    case "succeeded":
      return `Attempt ${r.attempt} succeeded${r.attempt > 1 ? ` after ${r.attempt - 1} failed attempt${r.attempt > 2 ? "s" : ""}` : ""}.`;
    case "exhausted": {
      const reason = {
        max_retries: `all ${r.max_retries} retries of policy ${r.policy_name} v${r.policy_version} are used`,
        non_retryable: `${r.last_error_class || "this"} errors are not retried`,
        retries_disabled: "retries are disabled for it",
        hold_expired: `it was ${holdExpired(r, history)} (holds spent none of its retries)`,
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

// whyScheduled explains a pending item's last decision. A hold says what
// held it and that it spent no retry; a failure's retry says which retry
// of the budget it spends.
function whyScheduled(r, sched, held, failure, now) {
  if (!sched) return failure + `Attempt ${r.attempt} runs ${relTime(r.next_attempt_at, now)}.`;
  const d = detailOf(sched);
  const policy = `Policy ${sched.policy_name || r.policy_name} v${sched.policy_version || r.policy_version} allows ${r.max_retries} retries (${r.retry_count} used so far)`;
  const cap = cappedText(d) ? ` The delay was ${cappedText(d)}.` : "";
  if (isHold(sched)) {
    // A hold of the attempt before this one names it: "attempt 1 was held
    // back"; a release is about the wait, not the attempt.
    const heldNow = held && held.attempt === sched.attempt - 1 && sched.decided_by !== "resume";
    const what = heldNow ? `Attempt ${held.attempt} was ${explain(sched)}` : sentence(explain(sched));
    const limit = d.max_hold_ms ? ` A hold may last ${fmtMS(d.max_hold_ms)} (max_hold)${d.held_since ? ` from ${dateTime(d.held_since)}` : ""}.` : "";
    // No end known: the time shown would be max_hold's, or when the
    // owner looks again, not when the attempt runs.
    const runs = r.held && !r.held.until ? `when the hold is released (at most ${holdLeft(r.held, now)} from now)` : relTime(r.next_attempt_at, now);
    return failure + `${what}, so attempt ${r.attempt} runs ${runs}.${cap}${limit} ${policy}.`;
  }
  return failure + `${policy}; ${explain(sched)}, so attempt ${r.attempt} runs ${relTime(r.next_attempt_at, now)}.${cap}`;
}

const titles = {
  failed: (e) => `Attempt ${e.attempt} failed`,
  held: (e) => `Attempt ${e.attempt} held back (${detailOf(e).reason || "hold"})`,
  released: (e) => `Released (${(detailOf(e).reason || "release").replaceAll("_", " ")})`,
  scheduled: (e) => isHold(e) ? `Held: attempt ${e.attempt} waits` : `Retry scheduled: attempt ${e.attempt}`,
  rescheduled: (e) => e.decided_by === "resume" ? `Released: attempt ${e.attempt} due now` : isHold(e) ? `Held: attempt ${e.attempt} waits` : `Rescheduled: attempt ${e.attempt}`,
  due: (e) => `Attempt ${e.attempt} due`,
  succeeded: (e) => `Attempt ${e.attempt} succeeded`,
  exhausted: (e) => `Exhausted after attempt ${e.attempt}`,
  cancelled: () => "Cancelled",
};

// decisionMeta lists the facts of a decision: what decided it, the delay,
// the limits that applied and the retry budget.
function decisionMeta(e, d) {
  const meta = [];
  // A pause without an end waits for a release: its delay and time are
  // max_hold's, no attempt's.
  const untilReleased = e.decided_by === "pause";
  if (e.decided_by) meta.push(`decided by ${e.decided_by.replaceAll("_", "-")}`);
  if (untilReleased && e.next_attempt_at) meta.push(`held until released, at most until ${dateTime(e.next_attempt_at)}`);
  else if (e.delay_ms !== undefined && e.delay_ms !== null) meta.push(`delay ${fmtMS(e.delay_ms)}${isHold(e) ? "" : delayParts(d)}`);
  if (d.backoff_class) meta.push(`backoff of class ${d.backoff_class}`);
  if (d.retry_after_ms) meta.push(`retry-after ${fmtMS(d.retry_after_ms)}`);
  if (d.capped_by) meta.push(cappedText(d));
  if (d.hold_reason) meta.push(`held (${d.hold_reason})${d.held_since ? ` since ${clock(d.held_since)}` : ""}`);
  if (d.max_hold_ms) meta.push(`max hold ${fmtMS(d.max_hold_ms)}`);
  if (d.hold_key) meta.push(`hold key ${d.hold_key}`);
  if (d.retry_count !== undefined) {
    meta.push(spendsNoRetry(e) ? `no retry spent (${d.retry_count} of ${d.max_retries} used)` : `retry ${d.retry_count} of ${d.max_retries}`);
  }
  if (e.next_attempt_at && !untilReleased) meta.push(`runs at ${clock(e.next_attempt_at)}`);
  if (d.note) meta.push(d.note);
  return meta;
}

// heldMeta lists what the owner said about a hold. The detail is the
// owner's text for operators, so it is shortened, not dropped.
function heldMeta(d) {
  return [
    d.reason && `reason ${d.reason}`,
    d.until ? `until ${dateTime(d.until)}` : "no end given",
    d.hold_key && `hold key ${d.hold_key}`,
    d.detail && trunc(d.detail, 160),
  ];
}

function releasedMeta(e, d) {
  return [
    d.hold_key && `hold key ${d.hold_key}`,
    d.hold_reason && `releases ${d.hold_reason} holds`,
    d.count && `at most ${d.count}`,
    d.by && `by ${d.by}`,
  ];
}

function exhaustedMeta(d, ctx) {
  const reason = `reason ${(d.reason || "").replaceAll("_", " ")}`;
  if (d.reason === "hold_expired") return [reason, ctx.holdExpired, `retries used ${retriesUsed(d.retry_count, d.max_retries)} (holds spend none)`];
  return [reason, `retries used ${retriesUsed(d.retry_count, d.max_retries)}`];
}

// eventMeta is the line of facts under an event's title.
function eventMeta(e, d, ctx) {
  switch (e.event) {
    case "scheduled": case "rescheduled": return decisionMeta(e, d);
    case "held": return heldMeta(d);
    case "released": return releasedMeta(e, d);
    case "failed": return [d.reason && `reason ${d.reason}`];
    case "due": return [d.emission > 1 && `emitted ${d.emission} times`];
    case "exhausted": return exhaustedMeta(d, ctx);
    case "cancelled": return [[d.by && `by ${d.by}`, d.reason].filter(Boolean).join(": ")];
  }
  return [];
}

// timelineItem draws one history entry; a decision also gets its plain
// English explanation, so the timeline reads without the docs.
function timelineItem(e, ctx) {
  const d = detailOf(e);
  const meta = eventMeta(e, d, ctx).filter(Boolean);
  if (e.policy_name) meta.push(`policy ${e.policy_name} v${e.policy_version}`);
  // The worker instance that ran the attempt (failed, held, succeeded),
  // when its owner said: where to look for its logs.
  if (e.executor) meta.push(`executor ${e.executor}`);
  const decision = (e.event === "scheduled" || e.event === "rescheduled") && e.decided_by;
  // A close of a held item its owner admitted after a release: the
  // release may have written nothing on the row before (it runs behind
  // an owner that admits the items itself), so the close says it.
  const admitted = e.event === "succeeded" && e.decided_by === "resume";
  const why = decision ? sentence(explain(e)) + "."
    : admitted ? `Admitted by its owner after a release (${releaseCause(d)}), no retry spent.` : null;
  return h("li", { "data-event": e.event, "data-decided-by": e.decided_by || null, style: { "--c": stateColors[e.event] || (e.event === "failed" ? "#b91c1c" : "#9ca3af") } },
    h("div", { class: "ev-head" },
      h("span", { class: "ev-title", text: (titles[e.event] || ((x) => x.event))(e) }),
      classTag(e.error_class),
      h("span", { class: "ev-time", title: e.at, text: clock(e.at) })),
    why ? h("div", { class: "ev-why", "data-test": "ev-why", text: why }) : null,
    meta.length ? h("div", { class: "ev-meta", text: meta.join(" · ") }) : null,
    e.error_message ? h("div", { class: "ev-msg", text: e.error_message }) : null);
}
