// The sources view: each source's gate (rate limit, pause, deferred
// events) with pause and resume.

import { api } from "./api.js";
import { h, clear, relTime, stamp } from "./dom.js";
import { actionDialog, toast } from "./dialog.js";

export async function render(root, params, { navigate }) {
  const tbody = h("tbody");
  root.appendChild(h("section", { class: "panel" },
    h("div", { class: "panel-head" }, h("h2", { text: "Sources" }),
      h("span", { class: "count", text: "Events of a paused or throttled source are deferred as retries (kind event), never dropped." })),
    h("div", { class: "table-wrap" }, h("table", {},
      h("thead", {}, h("tr", {}, ["Source", "Rate limit", "State", "Deferred events", "Allowed types", "Updated", ""].map((t) => h("th", { text: t })))),
      tbody))));

  async function refresh() {
    const { sources } = await api.listSources();
    clear(tbody);
    if (!sources.length) {
      tbody.appendChild(h("tr", {}, h("td", { colspan: 7, class: "empty", text: "No source has a gate yet: set one with retryd sources set, or pause one." })));
      return;
    }
    const now = Date.now();
    for (const s of sources) {
      // A pause with an end ends by itself.
      const paused = s.paused && !(s.paused_until && Date.parse(s.paused_until) <= now);
      tbody.appendChild(h("tr", { "data-source": s.source },
        h("td", { class: "mono", text: s.source }),
        h("td", { text: s.rate_limit ? `${s.rate_limit} per ${s.rate_window}` : "none" }),
        h("td", {}, paused
          ? [h("span", { class: "badge paused", text: "paused" }), " ", h("span", { class: "muted", text: [s.paused_until && `until ${stamp(s.paused_until, now)}`, s.pause_reason].filter(Boolean).join(" · ") })]
          : [h("span", { class: "badge succeeded", text: "open" }), s.paused_until && s.paused ? h("span", { class: "muted", text: ` pause ended ${relTime(s.paused_until, now)}` }) : null]),
        h("td", { class: "num" }, s.deferred
          ? h("a", { href: "#", onclick: (e) => { e.preventDefault(); navigate("retries", { kind: "event", source: s.source, state: "scheduled" }); }, text: String(s.deferred) })
          : "0"),
        h("td", { text: (s.allowed_types || []).join(", ") || "any" }),
        h("td", { class: "muted", text: relTime(s.updated_at, now) }),
        h("td", {}, h("div", { class: "actions" },
          paused
            ? h("button", { class: "small primary needs-operator", "data-test": "resume", onclick: () => resume(s.source), text: "Resume" })
            : h("button", { class: "small needs-operator", "data-test": "pause", onclick: () => pause(s.source), text: "Pause" })))));
    }
  }

  async function pause(source) {
    const done = await actionDialog({
      title: `Pause source ${source}?`,
      message: "Its events are deferred, not dropped, until you resume it (or the pause ends).",
      confirm: "Pause",
      fields: [
        { name: "reason", label: "Reason", placeholder: "e.g. partner maintenance" },
        { name: "minutes", label: "For how many minutes (empty: until resumed)", type: "number" },
      ],
      action: (v) => {
        const min = Number(v.minutes);
        if (v.minutes && !(min > 0)) throw new Error("Minutes must be a positive number.");
        return api.pauseSource(source, v.reason, v.minutes ? new Date(Date.now() + min * 60000).toISOString() : undefined);
      },
    });
    if (done) { toast(`Paused ${source}`); await refresh(); }
  }

  async function resume(source) {
    const done = await actionDialog({
      title: `Resume source ${source}?`,
      message: "Deferred events come back at their next retry.",
      confirm: "Resume",
      action: () => api.resumeSource(source),
    });
    if (done) { toast(`Resumed ${source}`); await refresh(); }
  }

  await refresh();
  return { refresh };
}
