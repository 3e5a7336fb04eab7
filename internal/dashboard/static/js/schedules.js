// The schedules view: the periodic jobs, JetStream message schedules on
// the SCHEDULES stream that fire one job a tick. Each row links to its
// jobs (their ids are sched-<name>-<sequence>); an admin deletes one
// here. Creating takes the CLI or the API (retryd schedules create).

import { api } from "./api.js";
import { h, clear, relTime, dateTime } from "./dom.js";
import { actionDialog, toast } from "./dialog.js";

const COLUMNS = ["Job type", "Name", "Pattern", "Time zone", "Priority", "Job ids", "Updated", ""];

export async function render(root, _params, { navigate }) {
  const tbody = h("tbody");
  const count = h("span", { class: "count", "data-test": "schedules-count" });
  root.appendChild(h("section", { class: "panel", "data-test": "schedules-list" },
    h("div", { class: "panel-head" }, h("h2", { text: "Periodic job schedules" }), count),
    h("div", { class: "table-wrap" }, h("table", {},
      h("thead", {}, h("tr", {}, COLUMNS.map((t) => h("th", { text: t })))), tbody)),
    h("p", { class: "panel-body muted", text: "Create one with `retryd schedules create JOB_TYPE NAME --every 1m` or PUT /v1/schedules/{job_type}/{name}." })));

  async function refresh() {
    const { schedules } = await api.listSchedules();
    const now = Date.now();
    count.textContent = schedules.length === 1 ? "1 schedule" : `${schedules.length} schedules`;
    clear(tbody);
    if (!schedules.length) {
      tbody.appendChild(h("tr", {}, h("td", { colspan: COLUMNS.length, class: "muted", text: "No schedule." })));
      return;
    }
    for (const s of schedules) {
      const key = `${s.job_type}/${s.name}`;
      tbody.appendChild(h("tr", { "data-schedule": key },
        h("td", { class: "mono" }, h("a", { href: "#", title: `jobs of type ${s.job_type}`,
          onclick: (e) => { e.preventDefault(); navigate("jobs", { job_type: s.job_type }); }, text: s.job_type })),
        h("td", { class: "mono", text: s.name }),
        h("td", { class: "mono", text: s.pattern }),
        h("td", { text: s.time_zone || "UTC" }),
        h("td", { text: s.priority || "normal" }),
        h("td", { class: "mono", text: `${s.job_id}-<seq>` }),
        h("td", { class: "nowrap muted", title: dateTime(s.updated_at), text: relTime(s.updated_at, now) }),
        h("td", {}, h("button", { class: "small needs-admin", "data-test": "delete-schedule",
          onclick: () => remove(s), text: "Delete" }))));
    }
  }

  async function remove(s) {
    const done = await actionDialog({
      title: `Delete schedule ${s.job_type}/${s.name}?`,
      message: "It fires no more. Jobs it already fired run on.",
      confirm: "Delete", danger: true,
      action: async () => { await api.deleteSchedule(s.job_type, s.name); return true; },
    });
    if (done) {
      toast(`Schedule ${s.job_type}/${s.name} deleted`);
      await refresh();
    }
  }

  await refresh();
  return { update: refresh, refresh };
}
