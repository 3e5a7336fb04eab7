// Calls to retryd's HTTP API. Errors carry the API's error body:
// {"error": {"code", "message", "field"}}.

import { actionDialog } from "./dialog.js";

const base = (document.querySelector('meta[name="retryd-api-base"]')?.content || "").replace(/\/+$/, "");

// signIn asks once for an API token when the API answers 401, posts it to
// /login (which checks it and keeps it in an HttpOnly session cookie the
// page itself cannot read) and has the page render again. Several failing
// calls share one dialog.
let signingIn = null;
function signIn(message) {
  signingIn ??= actionDialog({
    title: "Sign in",
    message: message || "This retryd API needs a token (rtd_…): ask an admin, or use the one retryd dev printed.",
    confirm: "Sign in",
    fields: [{ name: "token", label: "API token", type: "password", placeholder: "rtd_…" }],
    action: async ({ token }) => {
      const resp = await fetch(base + "/login", {
        method: "POST",
        headers: { "Content-Type": "application/json", Accept: "application/json" },
        body: JSON.stringify({ token }),
      });
      if (!resp.ok) {
        const data = await resp.json().catch(() => null);
        throw new Error(data?.error?.message || `sign-in failed (HTTP ${resp.status})`);
      }
      // The page renders again with the cookie (app.js).
      window.dispatchEvent(new Event("retryd:signed-in"));
      return true;
    },
  }).finally(() => { signingIn = null; });
  return signingIn;
}

export class APIError extends Error {
  constructor(status, code, message, field) {
    super(message || `HTTP ${status}`);
    this.status = status;
    this.code = code;
    this.field = field;
  }
}

async function call(method, path, { query, body, local } = {}) {
  let url = (local ? "" : base) + path;
  if (query) {
    const q = new URLSearchParams();
    for (const [k, v] of Object.entries(query)) if (v !== undefined && v !== null && v !== "") q.set(k, v);
    const qs = q.toString();
    if (qs) url += "?" + qs;
  }
  const init = { method, headers: { Accept: "application/json" } };
  if (body !== undefined) {
    init.headers["Content-Type"] = "application/json";
    init.body = JSON.stringify(body);
  }
  let resp;
  try {
    resp = await fetch(url, init);
  } catch (e) {
    throw new APIError(0, "unreachable", `cannot reach the retryd API (${e.message})`);
  }
  const text = await resp.text();
  let data = null;
  try { data = text ? JSON.parse(text) : null; } catch { data = null; }
  if (resp.status === 401) signIn();
  if (!resp.ok) {
    const err = data && data.error ? data.error : {};
    throw new APIError(resp.status, err.code || `http_${resp.status}`, err.message || text.trim() || resp.statusText, err.field);
  }
  return data;
}

const seg = encodeURIComponent;
const jt = (jobType) => (jobType ? seg(jobType) : "_");

export const api = {
  summary: () => call("GET", "api/summary", { local: true }),
  whoami: () => call("GET", "/v1/whoami"),
  signOut: async () => {
    await fetch(base + "/logout", { method: "POST", headers: { Accept: "application/json" } });
  },
  listRetries: (filter) => call("GET", "/v1/retries", { query: filter }),
  getRetry: (kind, id) => call("GET", `/v1/retries/${seg(kind)}/${seg(id)}`),
  cancelRetry: (kind, id, reason) => call("POST", `/v1/retries/${seg(kind)}/${seg(id)}/cancel`, { body: { reason } }),
  retryNow: (kind, id, reason, reset) =>
    call("POST", `/v1/retries/${seg(kind)}/${seg(id)}/retry`, { body: { reason, reset_attempts: !!reset } }),
  analytics: (query) => call("GET", "/v1/analytics/retries", { query }),
  listSources: () => call("GET", "/v1/sources"),
  pauseSource: (source, reason, until) => call("POST", `/v1/sources/${seg(source)}/pause`, { body: { reason, ...(until ? { until } : {}) } }),
  resumeSource: (source) => call("POST", `/v1/sources/${seg(source)}/resume`),
  listPolicies: () => call("GET", "/v1/policies"),
  policyTemplate: (kind) => call("GET", "/v1/policies/template", { query: { kind } }),
  putPolicy: (kind, jobType, body) => call("PUT", `/v1/policies/${seg(kind)}/${jt(jobType)}`, { body }),
  policyVersions: (kind, jobType) => call("GET", `/v1/policies/${seg(kind)}/${jt(jobType)}/versions`),
  listJobs: (filter) => call("GET", "/v1/jobs", { query: filter }),
  getJob: (id) => call("GET", `/v1/jobs/${seg(id)}`),
  retryJob: (id, reason) => call("POST", `/v1/jobs/${seg(id)}/retry`, { body: { reason } }),
  cancelJob: (id, reason) => call("POST", `/v1/jobs/${seg(id)}/cancel`, { body: { reason } }),
  // Runs are the triggers service's; a run's retry is retryNow("run", id).
  listRuns: (filter) => call("GET", "/v1/runs", { query: filter }),
  getRun: (id) => call("GET", `/v1/runs/${seg(id)}`),
  listSchedules: () => call("GET", "/v1/schedules"),
  deleteSchedule: (jobType, name) => call("DELETE", `/v1/schedules/${seg(jobType)}/${seg(name)}`),
  // bulkRetry's body: {filter, dry_run, rate_per_second, reason}. dry_run
  // is required by the API, so a bulk retry never starts by accident.
  bulkRetry: (body) => call("POST", "/v1/jobs/bulk-retry", { body }),
  listOperations: (query) => call("GET", "/v1/operations", { query }),
  getOperation: (id) => call("GET", `/v1/operations/${seg(id)}`),
  cancelOperation: (id) => call("POST", `/v1/operations/${seg(id)}/cancel`),
};
