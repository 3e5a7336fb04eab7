// The analytics view: every kind's retried work, then job outcomes,
// retries and errors per job type and error class (GET
// /v1/analytics/retries).

import { api } from "./api.js";
import { h, clear, pct, fmtMS, stateColors, classColors } from "./dom.js";
import { stackedBars, columns } from "./charts.js";

const STATUSES = ["completed", "retrying", "held", "in_progress", "failed_max_retries", "failed", "cancelled"];
const CLASSES = ["timeout", "rate_limit", "network", "temporary", "validation", "authentication", "permission", "unknown"];

export async function render(root, params, { navigate }) {
  const days = params.days || "1";
  const body = h("div", { class: "stack" });
  root.appendChild(h("div", { class: "stack" },
    h("section", { class: "panel" },
      h("div", { class: "filters" },
        h("label", {}, "Jobs created in the last",
          h("select", { "data-test": "analytics-days", onchange: (e) => navigate("analytics", { days: e.target.value }) },
            [["1", "day"], ["7", "7 days"], ["30", "30 days"]].map(([v, t]) => h("option", { value: v, text: t, selected: v === days })))),
        h("span", { class: "count", text: "Every kind of retried work, then the jobs run by workers (kind job) per type" }))),
    body));

  async function refresh() {
    const a = await api.analytics({ days });
    draw(a);
  }

  function draw(a) {
    clear(body);
    body.appendChild(kindsPanel(a.kinds || []));
    const types = a.job_types || [];
    if (!types.length) {
      body.appendChild(h("section", { class: "panel" }, h("div", { class: "empty", text: "No jobs in this period yet. Enqueue jobs with the worker SDK (retryd dev --demo does)." })));
      return;
    }
    const sum = (f) => types.reduce((acc, t) => acc + (f(t) || 0), 0);
    const succeeded = sum((t) => t.succeeded), failed = sum((t) => t.failed);
    const retried = sum((t) => t.retried_jobs), retriedOK = sum((t) => t.retried_succeeded);
    body.appendChild(h("div", { class: "kpis", "data-test": "kpis" },
      kpi(sum((t) => t.total_jobs).toLocaleString(), "jobs"),
      kpi(succeeded + failed ? pct(succeeded / (succeeded + failed)) : "–", "success rate (finished jobs)"),
      kpi(sum((t) => t.total_retries).toLocaleString(), "retries"),
      kpi(retried ? pct(retriedOK / retried) : "–", "retried jobs that succeeded"),
      kpi(sum((t) => (t.by_status || {}).failed_max_retries).toLocaleString(), "failed after max retries")));

    const byStatus = types.map((t) => ({ label: t.job_type, parts: t.by_status || {} }));
    const byClass = types.map((t) => ({ label: t.job_type, parts: Object.fromEntries((t.errors_by_class || []).map((c) => [c.class, c.count])) }));
    body.appendChild(h("div", { class: "grid2" },
      panel("Outcomes by job type", stackedBars(byStatus, STATUSES, stateColors), "analytics-outcomes"),
      panel("Failures by error class", stackedBars(byClass, CLASSES, classColors), "analytics-errors")));

    body.appendChild(h("div", { class: "cards" }, types.map(card)));
  }

  await refresh();
  return { refresh };
}

// kindsPanel lists each kind the scheduler retried in the period: items
// whose first failure fell in it, their outcomes and the failed attempts
// by error class.
function kindsPanel(kinds) {
  if (!kinds.length) {
    return panel("Retried work by kind", h("div", { class: "empty", text: "Nothing was retried in this period." }), "analytics-kinds");
  }
  const cols = ["kind", "items", "succeeded", "exhausted", "success rate", "retries", "retried items", "errors by class"];
  return panel("Retried work by kind", h("table", {},
    h("thead", {}, h("tr", {}, cols.map((c) => h("th", { text: c })))),
    h("tbody", {}, kinds.map((k) => h("tr", { "data-kind": k.kind },
      h("td", { class: "mono", text: k.kind }),
      h("td", { class: "num", text: k.items }),
      h("td", { class: "num", text: k.succeeded }),
      h("td", { class: "num", text: k.exhausted }),
      h("td", { class: "num", text: pct(k.success_rate) }),
      h("td", { class: "num", text: k.total_retries }),
      h("td", { class: "num", text: k.retried_items }),
      h("td", {}, (k.errors_by_class || []).map((c) => h("span", { class: `cls ${c.class}`, text: `${c.class} ${c.count}` }))))))),
    "analytics-kinds");
}

function kpi(v, l) {
  return h("div", { class: "kpi" }, h("div", { class: "v", text: v }), h("div", { class: "l", text: l }));
}

function panel(title, content, test) {
  return h("section", { class: "panel", "data-test": test },
    h("div", { class: "panel-head" }, h("h2", { text: title })),
    h("div", { class: "panel-body" }, content));
}

function card(t) {
  const dist = (t.retry_distribution || []).map((b) => ({ label: String(b.retries), value: b.jobs }));
  const top = (t.top_errors || []).slice(0, 4);
  return h("section", { class: "panel card", "data-test": "analytics-card", "data-job-type": t.job_type },
    h("div", { class: "panel-head" }, h("h3", { text: t.job_type })),
    h("div", { class: "panel-body stack" },
      h("div", { class: "kpis" },
        kpi(pct(t.success_rate), "success rate"),
        kpi(t.avg_attempts_to_success ? t.avg_attempts_to_success.toFixed(2) : "–", "attempts to success"),
        kpi(pct(t.retry_success_rate), "retry success"),
        kpi(t.time_to_success_ms?.p50 ? fmtMS(t.time_to_success_ms.p50) : "–", "p50 to success")),
      dist.length ? h("div", {}, h("div", { class: "hint", text: "Jobs by retries used" }), columns(dist, "#2563eb", { unit: " retries" })) : null,
      top.length ? h("div", {},
        h("div", { class: "hint", text: "Most common errors" }),
        h("table", {}, h("tbody", {}, top.map((e) => h("tr", {},
          h("td", { class: "num", text: e.count }),
          h("td", {}, h("span", { class: `cls ${e.class}`, text: e.class })),
          h("td", { class: "mono", text: e.pattern })))))) : null));
}
