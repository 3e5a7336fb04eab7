// DOM building and formatting helpers. Text always goes in through
// textContent, never innerHTML: API data cannot inject markup.

export function h(tag, attrs, ...children) {
  const el = document.createElement(tag);
  for (const [k, v] of Object.entries(attrs || {})) {
    if (v === undefined || v === null || v === false) continue;
    if (k === "class") el.className = v;
    else if (k === "text") el.textContent = v;
    else if (k === "style") for (const [p, val] of Object.entries(v)) el.style.setProperty(p, val);
    else if (k === "dataset") Object.assign(el.dataset, v);
    else if (k.startsWith("on") && typeof v === "function") el.addEventListener(k.slice(2), v);
    else if (v === true) el.setAttribute(k, "");
    else el.setAttribute(k, String(v));
  }
  append(el, children);
  return el;
}

function append(el, children) {
  for (const c of children) {
    if (c === undefined || c === null || c === false) continue;
    if (Array.isArray(c)) append(el, c);
    else if (c instanceof Node) el.appendChild(c);
    else el.appendChild(document.createTextNode(String(c)));
  }
}

export function clear(el) {
  while (el.firstChild) el.removeChild(el.firstChild);
  return el;
}

const SVG = "http://www.w3.org/2000/svg";

export function s(tag, attrs, ...children) {
  const el = document.createElementNS(SVG, tag);
  for (const [k, v] of Object.entries(attrs || {})) {
    if (v === undefined || v === null) continue;
    if (k === "text") el.textContent = v;
    else el.setAttribute(k, String(v));
  }
  for (const c of children.flat()) if (c) el.appendChild(c);
  return el;
}

// Durations and times.

export function fmtMS(ms) {
  if (ms === null || ms === undefined) return "";
  const neg = ms < 0;
  ms = Math.abs(ms);
  let out;
  if (ms < 1000) out = `${Math.round(ms)}ms`;
  else if (ms < 10000) out = `${(ms / 1000).toFixed(1).replace(/\.0$/, "")}s`;
  else if (ms < 60000) out = `${Math.round(ms / 1000)}s`;
  else if (ms < 3600000) out = pair(ms, 60000, 1000, "m", "s");
  else if (ms < 172800000) out = pair(ms, 3600000, 60000, "h", "m");
  else out = pair(ms, 86400000, 3600000, "d", "h");
  return neg ? "-" + out : out;
}

// pair writes ms as a big and a small unit ("1h5m"), rounded to the
// small unit first so 1h59m59.9s reads "2h", not "1h60m"; a zero small
// part is left out ("30d", not "30d0h").
function pair(ms, big, small, bigName, smallName) {
  const total = Math.round(ms / small), per = big / small;
  const hi = Math.floor(total / per), lo = total % per;
  return lo ? `${hi}${bigName}${lo}${smallName}` : `${hi}${bigName}`;
}

export function relTime(iso, now = Date.now()) {
  if (!iso) return "";
  const d = Date.parse(iso) - now;
  if (Math.abs(d) < 1000) return "now";
  return d > 0 ? `in ${fmtMS(d)}` : `${fmtMS(-d)} ago`;
}

export function clock(iso) {
  if (!iso) return "";
  const d = new Date(iso);
  const p = (n, w = 2) => String(n).padStart(w, "0");
  return `${p(d.getHours())}:${p(d.getMinutes())}:${p(d.getSeconds())}.${p(d.getMilliseconds(), 3)}`;
}

export function dateTime(iso) {
  if (!iso) return "";
  const d = new Date(iso);
  return `${d.toLocaleDateString()} ${clock(iso)}`;
}

// stamp is a time as its date and how far from now it is.
export function stamp(iso, now) {
  return `${dateTime(iso)} (${relTime(iso, now)})`;
}

export function pct(r) {
  return r === null || r === undefined ? "–" : `${(r * 100).toFixed(1)}%`;
}

export function badge(state) {
  return h("span", { class: `badge ${state}`, text: state.replaceAll("_", " ") });
}

export function classTag(cls) {
  return cls ? h("span", { class: `cls ${cls}`, text: cls }) : null;
}

export function trunc(str, n) {
  if (!str) return "";
  return str.length > n ? str.slice(0, n - 1) + "…" : str;
}

// Colors shared by charts, legends and the timeline.
export const stateColors = {
  scheduled: "#d97706", rescheduled: "#d97706", retrying: "#d97706",
  due: "#2563eb", in_progress: "#60a5fa",
  succeeded: "#16a34a", completed: "#16a34a",
  exhausted: "#dc2626", failed_max_retries: "#dc2626",
  failed: "#b91c1c", cancelled: "#9ca3af",
  held: "#0891b2", released: "#0891b2",
};

export const classColors = {
  timeout: "#ea580c", rate_limit: "#ca8a04", network: "#0284c7", temporary: "#7c3aed",
  validation: "#dc2626", authentication: "#be123c", permission: "#9f1239", unknown: "#6b7280",
};
