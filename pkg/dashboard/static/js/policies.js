// The policies view: every retry policy, an editor with a live preview of
// the delay schedule, and each policy's versions.

import { api } from "./api.js";
import { h, clear, fmtMS, relTime, dateTime } from "./dom.js";
import { ranges } from "./charts.js";
import { toast } from "./dialog.js";

const CLASSES = ["timeout", "rate_limit", "network", "temporary", "authentication", "permission", "validation", "unknown"];
const JITTERS = ["additive", "full", "equal", "none"];

export async function render(root) {
  const tbody = h("tbody");
  const editor = h("section", { class: "panel", "data-test": "policy-editor", hidden: true });
  const layout = h("div", { class: "split" },
    h("section", { class: "panel" },
      h("div", { class: "panel-head" }, h("h2", { text: "Retry policies" }),
        h("span", { class: "count", text: "The policy of an item: its (kind, job type), else the kind's default (_), else *." }),
        h("button", { class: "small", onclick: () => edit(null), text: "New policy" })),
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
        h("td", { text: `${fmtMS(p.base_delay_ms)} ×${p.multiplier} ≤ ${fmtMS(p.max_delay_ms)}` }),
        h("td", { text: p.jitter === "additive" ? `+0–${fmtMS(p.jitter_ms)}` : p.jitter }),
        h("td", { text: p.enabled ? "yes" : "no" }),
        h("td", {}, h("button", { class: "small", "data-test": "edit-policy", onclick: () => edit(p), text: "Edit" }))));
    }
  }

  function edit(p) {
    const isNew = !p;
    p = p || { kind: "job", job_type: "", name: "", version: 0, max_retries: 3, base_delay_ms: 1000, multiplier: 2,
      max_delay_ms: 60000, jitter: "additive", jitter_ms: 500, retryable_classes: [], non_retryable_classes: ["authentication", "permission", "validation"], enabled: true };
    editing = `${p.kind}/${p.job_type || "_"}`;
    layout.classList.add("with-detail");
    editor.hidden = false;
    const f = {};
    const input = (name, label, value, attrs = {}) => {
      f[name] = h("input", { name, value, ...attrs, oninput: preview });
      return h("label", {}, label, f[name]);
    };
    const select = (name, label, value, options) => {
      f[name] = h("select", { name, onchange: preview }, options.map((o) => h("option", { value: o, text: o, selected: o === value })));
      return h("label", {}, label, f[name]);
    };
    const checks = (name, selected) => {
      f[name] = CLASSES.map((c) => h("input", { type: "checkbox", value: c, checked: selected.includes(c) }));
      return h("div", { class: "checks" }, f[name].map((cb) => h("label", {}, cb, cb.value)));
    };
    const error = h("div", { class: "err", hidden: true });
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
          input("base_delay", "Base delay (ms)", p.base_delay_ms, { type: "number", min: 0 }),
          input("multiplier", "Multiplier", p.multiplier, { type: "number", min: 1, step: "0.1" }),
          input("max_delay", "Max delay (ms)", p.max_delay_ms, { type: "number", min: 0 }),
          select("jitter", "Jitter", p.jitter, JITTERS),
          input("jitter_ms", "Jitter max (ms, additive)", p.jitter_ms, { type: "number", min: 0 }),
          h("label", { class: "wide" }, "Always retry these classes", checks("retryable", p.retryable_classes || [])),
          h("label", { class: "wide" }, "Never retry these classes", checks("non_retryable", p.non_retryable_classes || [])),
          h("label", { class: "wide" }, h("span", { class: "checks" }, (f.enabled = h("input", { type: "checkbox", checked: p.enabled })), " Retries enabled"))),
        error,
        h("div", { class: "actions" },
          h("button", { class: "primary", "data-test": "save-policy", onclick: save, text: isNew ? "Create policy" : "Save as a new version" }),
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
        h("div", { class: "hint", text: "Bars: time since the first failure when each retry runs, with jitter bounds." }));
    }

    async function save() {
      const v = values();
      error.hidden = true;
      try {
        const saved = await api.putPolicy(v.kind, v.job_type, v.body);
        toast(`Policy ${saved.kind}/${saved.job_type || "_"} is now v${saved.version}`);
        await refresh();
        edit(saved);
      } catch (e) {
        error.textContent = e.field ? `${e.field}: ${e.message}` : e.message;
        error.hidden = false;
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
  return `${p.max_retries} retries, ${fmtMS(p.base_delay_ms)} ×${p.multiplier} ≤ ${fmtMS(p.max_delay_ms)}, ${p.jitter}${p.jitter === "additive" ? " " + fmtMS(p.jitter_ms) : ""}${p.enabled ? "" : ", disabled"}`;
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
