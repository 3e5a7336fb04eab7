// The policies view: every retry policy, an editor with a live preview of
// the delay schedule, and each policy's versions.

import { api } from "./api.js";
import { h, clear, fmtMS, relTime, dateTime } from "./dom.js";
import { ranges } from "./charts.js";
import { toast } from "./dialog.js";

const CLASSES = ["timeout", "rate_limit", "network", "temporary", "authentication", "permission", "validation", "unknown"];
const JITTERS = ["additive", "full", "equal", "none"];
// Where a new policy starts, from the API (GET /v1/policies/template:
// the seeded fallback's values), so the editor and the seed cannot drift
// apart. Its max_hold_ms and max_retry_after_ms are also what the API
// stores for limits left at 0: summaries leave those out.
let template = null;

export async function render(root) {
  template = template || await api.policyTemplate("job");
  const tbody = h("tbody");
  const editor = h("section", { class: "panel", "data-test": "policy-editor", hidden: true });
  const layout = h("div", { class: "split" },
    h("section", { class: "panel" },
      h("div", { class: "panel-head" }, h("h2", { text: "Retry policies" }),
        h("span", { class: "count", text: "The policy of an item: its (kind, job type), else the kind's default (_), else *." }),
        h("button", { class: "small needs-admin", "data-test": "new-policy", onclick: () => edit(null), text: "New policy" })),
      h("div", { class: "table-wrap" }, h("table", {},
        h("thead", {}, h("tr", {}, ["Kind", "Job type", "Name", "Version", "Max retries", "Backoff", "Jitter", "Enabled", ""].map((t) => h("th", { text: t })))),
        tbody))),
    editor);
  root.appendChild(layout);
  let editing = null;

  async function refresh() {
    const { policies } = await api.listPolicies();
    clear(tbody);
    for (const p of policies) {
      const key = `${p.kind}/${p.job_type || "_"}`;
      tbody.appendChild(h("tr", { class: editing === key ? "selected" : "", "data-policy": key },
        h("td", { text: p.kind }),
        h("td", { class: "mono", text: p.job_type || "_" }),
        h("td", { text: p.name }),
        h("td", { class: "num", text: `v${p.version}` }),
        h("td", { class: "num", text: p.max_retries }),
        h("td", { text: `${fmtMS(p.base_delay_ms)} ×${p.multiplier} ≤ ${fmtMS(p.max_delay_ms)}${classNote(p.class_backoff)}` }),
        h("td", { text: p.jitter === "additive" ? `+0–${fmtMS(p.jitter_ms)}` : p.jitter }),
        h("td", { text: p.enabled ? "yes" : "no" }),
        h("td", {}, h("button", { class: "small needs-admin", "data-test": "edit-policy", onclick: () => edit(p), text: "Edit" }))));
    }
  }

  function edit(p) {
    const isNew = !p;
    p = p || { ...structuredClone(template), class_backoff: { ...(template.class_backoff || {}) } };
    editing = `${p.kind}/${p.job_type || "_"}`;
    layout.classList.add("with-detail");
    editor.hidden = false;
    const f = {};
    // field is the API's name for an input: a validation error names it.
    const input = (name, label, value, attrs = {}, field = name) => {
      f[name] = h("input", { name, value, "data-field": field, ...attrs, oninput: preview });
      return h("label", {}, label, f[name]);
    };
    const msInput = (name, label, value, field) =>
      withReadout(input(name, label, value, { type: "number", min: 0 }, field), f[name]);
    const select = (name, label, value, options) => {
      f[name] = h("select", { name, "data-field": name, onchange: preview }, options.map((o) => h("option", { value: o, text: o, selected: o === value })));
      return h("label", {}, label, f[name]);
    };
    const checks = (name, selected) => {
      f[name] = CLASSES.map((c) => h("input", { type: "checkbox", value: c, checked: selected.includes(c) }));
      return h("div", { class: "checks" }, f[name].map((cb) => h("label", {}, cb, cb.value)));
    };
    const error = h("div", { class: "err", "data-test": "policy-error", hidden: true });
    const classes = classBackoffEditor(p.class_backoff || {}, preview);
    const previewBox = h("div");
    const versions = h("div");
    clear(editor).append(
      h("div", { class: "panel-head" },
        h("h2", { text: isNew ? "New policy" : `Edit ${p.kind} / ${p.job_type || "_"} (v${p.version})` }),
        h("button", { class: "small", style: { "margin-left": "auto" }, onclick: close, text: "✕" })),
      h("div", { class: "panel-body stack" },
        h("div", { class: "form" },
          isNew ? input("kind", "Kind", p.kind) : null,
          isNew ? input("job_type", "Job type (empty: the kind's default)", p.job_type) : null,
          input("name", "Name", p.name, { placeholder: "e.g. send-email" }),
          input("max_retries", "Max retries", p.max_retries, { type: "number", min: 0, max: 1000 }),
          msInput("base_delay", "Base delay (ms)", p.base_delay_ms, "base_delay_ms"),
          input("multiplier", "Multiplier", p.multiplier, { type: "number", min: 1, step: "0.1" }),
          msInput("max_delay", "Max delay (ms)", p.max_delay_ms, "max_delay_ms"),
          select("jitter", "Jitter", p.jitter, JITTERS),
          msInput("jitter_ms", "Jitter max (ms, additive)", p.jitter_ms, "jitter_ms"),
          msInput("max_retry_after", "Max retry-after (ms)", p.max_retry_after_ms, "max_retry_after_ms"),
          msInput("max_hold", "Max hold (ms)", p.max_hold_ms, "max_hold_ms"),
          h("p", { class: "hint wide", text: "Max retry-after caps an error's own retry-after hint. Max hold is how long an item may be held back (throttled, paused, waiting for a slot) before it is exhausted as hold_expired; holds use no retry." }),
          h("label", { class: "wide" }, "Always retry these classes", checks("retryable", p.retryable_classes || [])),
          h("label", { class: "wide" }, "Never retry these classes", checks("non_retryable", p.non_retryable_classes || [])),
          h("label", { class: "wide" }, h("span", { class: "checks" }, (f.enabled = h("input", { type: "checkbox", checked: p.enabled })), " Retries enabled"))),
        classes.el,
        error,
        h("div", { class: "actions" },
          h("button", { class: "primary needs-admin", "data-test": "save-policy", onclick: save, text: isNew ? "Create policy" : "Save as a new version" }),
          h("button", { onclick: close, text: "Close" })),
        h("div", {}, h("h3", { text: "Schedule if every attempt fails", style: { "font-size": "14px" } }), previewBox),
        versions));
    preview();
    if (!isNew) loadVersions(p, versions);

    function values() {
      return {
        kind: isNew ? f.kind.value.trim() : p.kind,
        job_type: isNew ? f.job_type.value.trim() : p.job_type,
        body: {
          name: f.name.value.trim() || `${isNew ? f.kind.value.trim() : p.kind}${(isNew ? f.job_type.value.trim() : p.job_type) ? "-" + (isNew ? f.job_type.value.trim() : p.job_type) : ""}`,
          max_retries: Number(f.max_retries.value),
          base_delay_ms: Number(f.base_delay.value),
          multiplier: Number(f.multiplier.value),
          max_delay_ms: Number(f.max_delay.value),
          jitter: f.jitter.value,
          jitter_ms: Number(f.jitter_ms.value) || 0,
          retryable_classes: f.retryable.filter((c) => c.checked).map((c) => c.value),
          non_retryable_classes: f.non_retryable.filter((c) => c.checked).map((c) => c.value),
          enabled: f.enabled.checked,
          // A PUT replaces the whole policy: these are sent back as shown,
          // or an edit of another field would reset them.
          max_hold_ms: Number(f.max_hold.value) || 0,
          max_retry_after_ms: Number(f.max_retry_after.value) || 0,
          class_backoff: classes.value(),
          ...(isNew ? {} : { version: p.version }),
          updated_by: "dashboard",
        },
      };
    }

    function preview() {
      const b = values().body;
      const steps = schedule(b, Math.min(b.max_retries, 12));
      clear(previewBox).append(steps.length
        ? ranges(steps.map((st) => ({ label: `retry ${st.retry}`, lo: st.cumLo, hi: st.cumHi })), fmtMS)
        : h("p", { class: "muted", text: "No retries: the first failure is final." }),
        h("div", { class: "hint", text: "Bars: time since the first failure when each retry runs, with jitter bounds." }),
        classPreview(b, Math.min(b.max_retries, 6)));
    }

    async function save() {
      const v = values();
      error.hidden = true;
      clearFieldErrors(editor);
      try {
        const saved = await api.putPolicy(v.kind, v.job_type, v.body);
        toast(`Policy ${saved.kind}/${saved.job_type || "_"} is now v${saved.version}`);
        await refresh();
        edit(saved);
      } catch (e) {
        // The API's messages start with the field they name already.
        error.textContent = e.field && !e.message.startsWith(e.field) ? `${e.field}: ${e.message}` : e.message;
        error.hidden = false;
        if (e.field) markField(editor, e.field, e.message);
      }
    }
  }

  function close() {
    editing = null;
    editor.hidden = true;
    layout.classList.remove("with-detail");
    refresh();
  }

  await refresh();
  return { refresh };
}

async function loadVersions(p, box) {
  try {
    const { versions } = await api.policyVersions(p.kind, p.job_type);
    clear(box).append(h("h3", { text: "Versions", style: { "font-size": "14px" } }),
      h("table", {}, h("tbody", {}, versions.map((v) => h("tr", {},
        h("td", { text: `v${v.version}` }),
        h("td", { class: "muted", title: dateTime(v.changed_at), text: relTime(v.changed_at) }),
        h("td", { text: v.changed_by }),
        h("td", { class: "mono", text: summarize(v.policy) }))))));
  } catch (e) {
    clear(box).append(h("p", { class: "err", text: e.message }));
  }
}

function summarize(p) {
  if (typeof p === "string") p = JSON.parse(p);
  return `${p.max_retries} retries, ${fmtMS(p.base_delay_ms)} ×${p.multiplier} ≤ ${fmtMS(p.max_delay_ms)}, ${p.jitter}${p.jitter === "additive" ? " " + fmtMS(p.jitter_ms) : ""}` +
    // The limits only when changed: every version carries the defaults.
    `${p.max_hold_ms && p.max_hold_ms !== template?.max_hold_ms ? `, max hold ${fmtMS(p.max_hold_ms)}` : ""}` +
    `${p.max_retry_after_ms && p.max_retry_after_ms !== template?.max_retry_after_ms ? `, max retry-after ${fmtMS(p.max_retry_after_ms)}` : ""}` +
    `${classNote(p.class_backoff)}${p.enabled ? "" : ", disabled"}`;
}

// classNote names the classes with a backoff of their own, for one-line
// summaries.
function classNote(cb) {
  const names = Object.keys(cb || {}).sort();
  return names.length ? ` · own backoff: ${names.join(", ")}` : "";
}

// withReadout adds a readable duration under a milliseconds input, so
// 2592000000 reads as 30d.
function withReadout(label, el) {
  const out = h("span", { class: "readout" });
  const show = () => { out.textContent = el.value === "" ? "" : `= ${fmtMS(Number(el.value))}`; };
  el.addEventListener("input", show);
  show();
  label.appendChild(out);
  return label;
}

// The fields of a class's backoff (pkg/policy.ClassBackoffMS): each left
// blank keeps the policy's value.
const CLASS_FIELDS = [
  { key: "base_delay_ms", label: "Base delay (ms)", ms: true },
  { key: "multiplier", label: "Multiplier", attrs: { min: 1, step: "0.1" } },
  { key: "max_delay_ms", label: "Max delay (ms)", ms: true },
  { key: "jitter", label: "Jitter", options: JITTERS },
  { key: "jitter_ms", label: "Jitter max (ms)", ms: true },
  { key: "first_delay_ms", label: "First retry's delay (ms, exact)", ms: true },
];

// classBackoffEditor edits class_backoff: one entry per error class with
// its own backoff. Classes are added from a list of those without one, so
// no class is given twice. value() is the object the API takes.
function classBackoffEditor(initial, onchange) {
  const entries = new Map(); // class -> {el, inputs}
  const list = h("div", { class: "stack" });
  const pick = h("select", { name: "class_backoff_add", "data-test": "class-backoff-class" });
  const add = h("button", { class: "small", "data-test": "class-backoff-add", onclick: () => { addEntry(pick.value, {}); onchange(); }, text: "Add" });
  const adder = h("div", { class: "actions" }, h("span", { class: "muted", text: "Give a class its own backoff:" }), pick, add);
  const el = h("div", { class: "class-backoffs", "data-test": "class-backoff" },
    h("h3", { text: "Backoff per error class", style: { "font-size": "14px" } }),
    h("p", { class: "hint", text: "A class listed here waits by its own curve; blank fields keep the policy's. First retry's delay is exact, without jitter (0: at once); later retries follow the class's curve. The retry budget is shared." }),
    list, adder);

  function addEntry(cls, cb) {
    if (!cls || entries.has(cls)) return;
    const inputs = {};
    const fields = CLASS_FIELDS.map((fd) => {
      const field = `class_backoff.${cls}.${fd.key}`;
      const value = cb[fd.key] ?? "";
      if (fd.options) {
        inputs[fd.key] = h("select", { name: fd.key, "data-field": field, onchange },
          ["", ...fd.options].map((o) => h("option", { value: o, text: o || "policy's", selected: o === value })));
        return h("label", {}, fd.label, inputs[fd.key]);
      }
      inputs[fd.key] = h("input", { type: "number", name: fd.key, "data-field": field, value, placeholder: "policy's",
        min: 0, ...fd.attrs, oninput: onchange });
      const label = h("label", {}, fd.label, inputs[fd.key]);
      return fd.ms ? withReadout(label, inputs[fd.key]) : label;
    });
    const entry = h("div", { class: "class-backoff", "data-class": cls },
      h("div", { class: "class-backoff-head" }, h("span", { class: `cls ${cls}`, text: cls }),
        h("button", { class: "small", "data-test": "class-backoff-remove", onclick: () => remove(cls), text: "Remove" })),
      h("div", { class: "form" }, fields));
    entries.set(cls, { el: entry, inputs });
    list.appendChild(entry);
    refreshPick();
  }

  function remove(cls) {
    entries.get(cls)?.el.remove();
    entries.delete(cls);
    refreshPick();
    onchange();
  }

  function refreshPick() {
    const left = CLASSES.filter((c) => !entries.has(c));
    clear(pick).append(...left.map((c) => h("option", { value: c, text: c })));
    adder.hidden = !left.length;
  }

  // value is class_backoff as the API takes it: only the fields filled in.
  function value() {
    const out = {};
    for (const [cls, { inputs }] of entries) {
      const cb = {};
      for (const fd of CLASS_FIELDS) {
        const v = inputs[fd.key].value.trim();
        if (v !== "") cb[fd.key] = fd.options ? v : Number(v);
      }
      out[cls] = cb;
    }
    return out;
  }

  for (const cls of Object.keys(initial).sort()) addEntry(cls, initial[cls]);
  refreshPick();
  return { el, value };
}

// classPreview lists the first retries of each class with its own
// backoff, as pkg/policy times them.
function classPreview(b, n) {
  const classes = Object.keys(b.class_backoff || {}).sort();
  if (!classes.length || n < 1) return null;
  return h("div", { class: "hint", "data-test": "class-preview" }, classes.map((c) =>
    h("div", {}, h("span", { class: `cls ${c}`, text: c }), " ",
      classSchedule(b, b.class_backoff[c], n).map((st) => st.lo === st.hi ? fmtMS(st.lo) : `${fmtMS(st.lo)}–${fmtMS(st.hi)}`).join(", "))));
}

// classSchedule is schedule() with a class's overrides applied; a first
// delay replaces the first retry's, exactly (later retries keep d(1), d(2)…).
export function classSchedule(b, cb, n) {
  const merged = { ...b };
  for (const fd of CLASS_FIELDS) if (fd.key !== "first_delay_ms" && cb[fd.key] !== undefined) merged[fd.key] = cb[fd.key];
  const steps = schedule(merged, n);
  if (cb.first_delay_ms !== undefined && steps.length) steps[0] = { ...steps[0], lo: cb.first_delay_ms, hi: cb.first_delay_ms };
  return steps;
}

// markField shows the API's validation error under the input it names.
function markField(root, field, message) {
  const el = root.querySelector(`[data-field="${CSS.escape(field)}"]`);
  if (!el) return;
  el.classList.add("invalid");
  el.setAttribute("aria-invalid", "true");
  el.closest("label")?.appendChild(h("span", { class: "field-err", "data-test": "field-error", text: message }));
  el.focus();
}

function clearFieldErrors(root) {
  root.querySelectorAll(".field-err").forEach((e) => e.remove());
  root.querySelectorAll(".invalid").forEach((e) => { e.classList.remove("invalid"); e.removeAttribute("aria-invalid"); });
}

// schedule mirrors pkg/backoff: delay n = min(base·multiplier^n, max),
// then jitter bounds: full [0, d], equal [d − d/2, d], additive [d, d + jitter].
export function schedule(b, n) {
  const out = [];
  let cumLo = 0, cumHi = 0;
  for (let i = 0; i < n; i++) {
    const d = Math.min(b.base_delay_ms * Math.pow(Math.max(b.multiplier, 1), i), b.max_delay_ms);
    let lo = d, hi = d;
    if (b.jitter === "full") lo = 0;
    else if (b.jitter === "equal") lo = d - Math.floor(d / 2);
    else if (b.jitter === "additive") hi = d + (b.jitter_ms || 0);
    cumLo += lo; cumHi += hi;
    out.push({ retry: i + 1, lo, hi, cumLo, cumHi });
  }
  return out;
}
