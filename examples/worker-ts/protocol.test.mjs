// @ts-check
// Unit tests of the wire protocol: `node --test` (Node 18+), also run by
// examples/e2e TestTypeScriptWorker.

import assert from "node:assert/strict";
import { test } from "node:test";
import { ContractError, decodeJob, dueToJob, failedData, jobMsg, lifecycleMsg, nameFired, reportable } from "./protocol.mjs";

const enc = (/** @type {unknown} */ v) => new TextEncoder().encode(typeof v === "string" ? v : JSON.stringify(v));
const env = (/** @type {Record<string, unknown>} */ data, /** @type {Record<string, unknown>} */ extra = {}) => ({
  specversion: "1.0", id: "job:01J:1", source: "t", type: "job.requested", time: "2025-03-14T15:09:26Z",
  datacontenttype: "application/json", data, ...extra,
});

test("a job decodes, with its band from the subject", () => {
  const { job } = decodeJob("jobs.send.high", enc(env({ id: "01J", job_type: "send", attempt: 1, priority: "high", payload: { a: 1 } })));
  assert.deepEqual(job, { id: "01J", job_type: "send", attempt: 1, priority: "high", payload: { a: 1 } });
});

test("a periodic schedule's tick is named by its sequence; a delayed job keeps its id", () => {
  const job = { id: "sched-nightly", job_type: "report", attempt: 1 };
  assert.equal(nameFired(job, "schedules.report.nightly", "2025-03-14T15:09:27Z", 42).id, "sched-nightly-42");
  assert.equal(nameFired(job, "delayed.report.x", "purge", 42).id, "sched-nightly");
  assert.equal(nameFired(job, undefined, undefined, 42).id, "sched-nightly");
  assert.throws(() => nameFired({ ...job, id: "x".repeat(127) }, "schedules.report.nightly", "t", 42), ContractError);
});

test("malformed jobs are refused, naming the field", () => {
  /** @type {[string, unknown, string][]} */
  const cases = [
    ["jobs.send", env({ id: "01J", job_type: "send", attempt: 1, atempt: 2 }), "data.atempt"],
    ["jobs.send", env({ id: "01J", job_type: "send", attempt: "1" }), "data.attempt"],
    ["jobs.send", env({ id: "01J", job_type: "send", attempt: 1.5 }), "data.attempt"],
    ["jobs.send", env({ id: "01J", job_type: "other", attempt: 1 }), "data.job_type"],
    ["jobs.send", env({ id: "a.b", job_type: "send", attempt: 1 }), "data.id"],
    ["jobs.send", env({ id: "01J", job_type: "send", attempt: 1, priority: "high" }), "data.priority"],
    ["jobs.send.low", env({ id: "01J", job_type: "send", attempt: 1 }), "data.priority"],
    ["jobs.send", env({ id: "01J", job_type: "send", attempt: 1, priority: 5 }), "data.priority"],
    ["jobs.send", env({ id: "01J", job_type: "send", attempt: 1, metadata: { k: 1 } }), "data.metadata"],
    ["jobs.send", env({ id: "01J", job_type: "send", attempt: 1 }, { extra: 1 }), "extra"],
    ["jobs.send", env({ id: "01J", job_type: "send", attempt: 1 }, { time: "yesterday" }), "time"],
    ["jobs.send", JSON.stringify(env({ id: "01J", job_type: "send", attempt: 1 })) + " {}", "envelope"],
    ["jobs.send.normal", env({ id: "01J", job_type: "send", attempt: 1 }), "subject"],
  ];
  for (const [subject, body, field] of cases) {
    assert.throws(() => decodeJob(subject, enc(body)), (/** @type {any} */ err) => err instanceof ContractError && err.field === field, `${subject} ${JSON.stringify(body)}: want ${field}`);
  }
  assert.throws(() => decodeJob("jobs.send", new Uint8Array([0xff, 0xfe])), ContractError);
});

test("a due becomes the job it asks for, without the due's own fields", () => {
  const due = {
    specversion: "1.0", id: "job-retry:01J:2", source: "retryd/scheduler", type: "retry.due", time: "2025-03-14T15:09:56.02Z",
    subject: "job/01J", datacontenttype: "application/json",
    data: { kind: "job", id: "01J", attempt: 2, next_attempt_at: "2025-03-14T15:09:56.01Z", job_type: "send", priority: "low",
      payload: { a: 1 }, checkpoint: { step: "x" }, metadata: { t: "1" }, max_retries: 0, retry_enabled: false, timeout_ms: 50 },
  };
  const job = dueToJob("retry.job.due.01J", enc(due), "job-retry:01J:2");
  assert.deepEqual(job, { id: "01J", job_type: "send", attempt: 2, priority: "low", payload: { a: 1 }, checkpoint: { step: "x" },
    max_retries: 0, retry_enabled: false, timeout_ms: 50, metadata: { t: "1" } });
  const out = jobMsg("w", job, new Date(0));
  assert.equal(out.subject, "jobs.send.low");
  assert.equal(out.msgID, "job-retry:01J:2");
  assert.equal(JSON.parse(out.body).id, "job-retry:01J:2");
  assert.throws(() => dueToJob("retry.job.due.01J", enc(due), "job-retry:01J:3"), ContractError);
  assert.throws(() => dueToJob("retry.job.due.01X", enc(due), undefined), ContractError);
  const noType = structuredClone(due);
  delete (/** @type {any} */ (noType.data)).job_type;
  assert.throws(() => dueToJob("retry.job.due.01J", enc(noType), undefined), ContractError);
});

test("a failed fact carries what the retry needs", () => {
  const job = { id: "01J", job_type: "send", attempt: 1, payload: { a: 1 }, metadata: { t: "1" }, retry_enabled: false, priority: /** @type {const} */ ("high") };
  const out = lifecycleMsg("w", "failed", failedData(job, { step: "x" }, { class: "network", message: "reset\u0000" }, "host-1"), new Date(0));
  assert.equal(out.subject, "retry.job.failed.01J");
  assert.equal(out.msgID, "job-failed:01J:1");
  assert.deepEqual(out.headers, { "Content-Type": "application/json", "Retryd-Kind": "job", "Retryd-Item-Id": "01J", "Retryd-Attempt": "1", "Retryd-Event": "failed" });
  assert.deepEqual(JSON.parse(out.body), {
    specversion: "1.0", id: "job-failed:01J:1", source: "w", type: "retry.failed", time: "1970-01-01T00:00:00.000Z", subject: "job/01J",
    datacontenttype: "application/json",
    data: { kind: "job", id: "01J", attempt: 1, error: { message: "reset\uFFFD", class: "network" }, job_type: "send", retry_enabled: false,
      priority: "high", payload: { a: 1 }, checkpoint: { step: "x" }, metadata: { t: "1" }, executor: "host-1" },
  });
});

test("error messages are cut to 4096 bytes on a character boundary", () => {
  const s = reportable("é".repeat(3000));
  assert.ok(Buffer.byteLength(s) <= 4096);
  assert.equal(s, "é".repeat(2048));
});
