// The dashboard's shell: hash routing between the views, the header's
// counts and the live refresh loop.

import { api } from "./api.js";
import { h, clear, stateColors } from "./dom.js";
import { isOpen } from "./dialog.js";
import * as retries from "./retries.js";
import * as analytics from "./analytics.js";
import * as sources from "./sources.js";
import * as policies from "./policies.js";
import * as jobs from "./jobs.js";
import * as runs from "./runs.js";
import * as schedules from "./schedules.js";

const views = { retries, jobs, runs, schedules, analytics, sources, policies };
const refreshMS = Number(document.querySelector('meta[name="retryd-refresh-ms"]')?.content) || 3000;
const main = document.getElementById("view");

let current = { name: null, view: null };
let lastRefresh = 0;

// route reads "#/view?key=value&...".
function route() {
  const raw = location.hash.replace(/^#\/?/, "");
  const [name, qs] = raw.split("?");
  return { name: views[name] ? name : "retries", params: Object.fromEntries(new URLSearchParams(qs || "")) };
}

// navigate changes the hash; the hashchange handler renders.
export function navigate(name, params = {}) {
  const q = new URLSearchParams();
  for (const [k, v] of Object.entries(params)) if (v) q.set(k, v);
  const qs = q.toString();
  const next = `#/${name}${qs ? "?" + qs : ""}`;
  if (location.hash === next) onRoute();
  else location.hash = next;
}

async function onRoute() {
  const { name, params } = route();
  document.querySelectorAll(".tabs a").forEach((a) => a.classList.toggle("active", a.dataset.view === name));
  if (current.name === name && current.view?.update) {
    await current.view.update(params);
    return;
  }
  current.view?.destroy?.();
  clear(main);
  current = { name, view: await views[name].render(main, params, { navigate }) };
  lastRefresh = Date.now();
}

const summaryStates = ["scheduled", "due", "exhausted", "succeeded", "cancelled"];

async function refreshSummary() {
  const el = document.getElementById("summary");
  let sum;
  try {
    sum = await api.summary();
  } catch (e) {
    if (e.status === 404) { el.hidden = true; return; }
    throw e;
  }
  const totals = Object.fromEntries(summaryStates.map((st) => [st, 0]));
  for (const c of sum.counts) totals[c.state] = (totals[c.state] || 0) + c.count;
  clear(el).append(...summaryStates.map((st) =>
    h("button", { class: "chip", title: `Show ${st} retries (${totals[st].toLocaleString()})`, "data-state": st, onclick: () => navigate("retries", { state: st }) },
      h("span", { class: "dot", style: { background: stateColors[st] } }),
      st === "scheduled" ? "pending" : st,
      h("b", { text: compact.format(totals[st]) }))));
}

// The counters are short (1.2K, 3.4M, the exact count in their title), so
// that the top bar keeps them on one line however large they grow.
const compact = new Intl.NumberFormat(undefined, { notation: "compact", maximumFractionDigits: 1 });

function banner(text) {
  const el = document.getElementById("banner");
  el.hidden = !text;
  el.textContent = text || "";
}

async function tick(force = false) {
  const live = document.getElementById("autorefresh").checked;
  if (!force && (!live || isOpen() || document.hidden)) return;
  try {
    await Promise.all([refreshSummary(), current.view?.refresh?.()]);
    lastRefresh = Date.now();
    banner("");
  } catch (e) {
    banner(e.status === 0 ? `${e.message}. Retrying…` : `Refresh failed: ${e.message}`);
  }
}

function showUpdated() {
  const el = document.getElementById("updated");
  if (!lastRefresh) return;
  const s = Math.round((Date.now() - lastRefresh) / 1000);
  el.textContent = s < 2 ? "updated just now" : `updated ${s}s ago`;
}

// whoami learns the principal (GET /v1/whoami): body[data-role] hides the
// buttons its role may not use (style.css), and a session from the
// sign-in gets a sign-out button. An API without the route shows all.
async function whoami() {
  let me;
  try {
    me = await api.whoami();
  } catch {
    delete document.body.dataset.role;
    document.getElementById("account").hidden = true;
    return;
  }
  document.body.dataset.role = me.role;
  const who = document.getElementById("whoami");
  who.textContent = who.title = `${me.name} (${me.role})`;
  document.getElementById("signout").hidden = !me.session;
  document.getElementById("account").hidden = false;
}

document.getElementById("signout").addEventListener("click", async () => {
  try {
    await api.signOut();
  } finally {
    // Without the cookie the page asks for a token again.
    location.reload();
  }
});

window.addEventListener("hashchange", () => onRoute().catch((e) => banner(e.message)));
// Signed in (api.js): render the view again, now with the session cookie.
window.addEventListener("retryd:signed-in", () => {
  current.name = null;
  whoami();
  onRoute().then(() => tick(true)).catch((e) => banner(e.message));
});
document.getElementById("autorefresh").addEventListener("change", () => tick(true));
whoami();
onRoute().then(() => tick(true)).catch((e) => banner(e.message));
setInterval(() => tick(), refreshMS);
setInterval(showUpdated, 1000);
