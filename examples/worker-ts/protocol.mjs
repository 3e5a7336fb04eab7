// @ts-check
// The retryd wire protocol for a job worker, as docs/contract.md and
// docs/worker-sdk.md ("The protocol (for any language)") write it: the
// subjects, the CloudEvents envelope, the message ids and headers, and the
// strict decoding of what the worker reads (job messages on JOBS, due
// events on RETRIES). Pure functions: no NATS in here.

import { Buffer } from "node:buffer";
import { randomBytes } from "node:crypto";

export const STREAM_JOBS = "JOBS";
export const STREAM_RETRIES = "RETRIES";
export const DUE_ROUTER_DURABLE = "worker-due-router";
export const DUE_FILTER = "retry.job.due.*";

/** Limits of docs/contract.md, "Strict decoding and limits". */
export const LIMITS = {
  envelopeBytes: 1 << 20,
  dataBytes: 512 << 10,
  depth: 32,
  messageBytes: 4096,
  metadataEntries: 32,
  maxRetries: 1000,
  maxAttempt: 1_000_000,
  maxTimeoutMS: 24 * 60 * 60 * 1000,
};

/** The retryable and final error classes (docs/contract.md). */
export const CLASSES = ["timeout", "network", "rate_limit", "temporary", "authentication", "permission", "validation", "unknown"];

const ID_RE = /^[A-Za-z0-9_-]{1,128}$/;
const TOKEN_RE = /^[a-z0-9][a-z0-9_-]{0,63}$/;
// RFC 3339 date-time, as Go's time.Time decodes it.
const TIME_RE = /^\d{4}-\d{2}-\d{2}T\d{2}:\d{2}:\d{2}(\.\d+)?(Z|[+-]\d{2}:\d{2})$/;

/**
 * @typedef {"high" | "normal" | "low"} Priority
 *
 * @typedef {object} JobData the `data` of a job message
 * @property {string} id
 * @property {string} job_type
 * @property {number} attempt
 * @property {Priority} [priority]
 * @property {unknown} [payload]
 * @property {unknown} [checkpoint]
 * @property {number} [max_retries]
 * @property {boolean} [retry_enabled]
 * @property {number} [timeout_ms]
 * @property {Record<string, string>} [metadata]
 *
 * @typedef {object} Envelope a CloudEvents 1.0 envelope in JSON structured mode
 * @property {"1.0"} specversion
 * @property {string} id
 * @property {string} source
 * @property {string} type
 * @property {string} time
 * @property {string} [subject]
 * @property {string} [datacontenttype]
 * @property {any} data
 *
 * @typedef {object} OutgoingMsg a message to publish with its Nats-Msg-Id
 * @property {string} subject
 * @property {string} msgID
 * @property {Record<string, string>} headers the headers besides Nats-Msg-Id
 * @property {string} body
 */

/** A message that breaks the contract: terminated, never retried. */
export class ContractError extends Error {
  /** @param {string} field @param {string} reason */
  constructor(field, reason) {
    super(`${field} ${reason}`);
    this.name = "ContractError";
    this.field = field;
  }
}

/** @param {boolean} ok @param {string} field @param {string} reason @returns {asserts ok} */
function check(ok, field, reason) {
  if (!ok) throw new ContractError(field, reason);
}

// ---------------------------------------------------------------- subjects

/** @param {string} jobType @param {Priority | undefined} priority */
export function jobSubject(jobType, priority) {
  return priority === "high" || priority === "low" ? `jobs.${jobType}.${priority}` : `jobs.${jobType}`;
}

/** The durable consumer of a job type's band (docs/jobs.md, Priority). @param {string} jobType @param {Priority} band */
export function consumerName(jobType, band) {
  return band === "normal" ? `worker-${jobType}` : `worker-${jobType}=${band}`;
}

/** @param {string} id @param {number} attempt */
export function jobMsgID(id, attempt) {
  return attempt <= 1 ? `job:${id}:1` : `job-retry:${id}:${attempt}`;
}

/** @param {"failed" | "succeeded" | "held"} event @param {string} id @param {number} attempt */
export function lifecycleMsgID(event, id, attempt) {
  return `job-${event}:${id}:${attempt}`;
}

// ---------------------------------------------------------------- decoding

const utf8 = new TextDecoder("utf-8", { fatal: true });

/**
 * Decodes a body strictly: valid UTF-8, one JSON value (JSON.parse refuses
 * trailing data), at most 1 MiB and 32 levels deep.
 * @param {Uint8Array} body
 * @returns {any}
 */
export function parseBody(body) {
  check(body.length <= LIMITS.envelopeBytes, "envelope", `is ${body.length} bytes, more than ${LIMITS.envelopeBytes}`);
  let text;
  try {
    text = utf8.decode(body);
  } catch {
    throw new ContractError("envelope", "is not valid UTF-8");
  }
  let v;
  try {
    v = JSON.parse(text);
  } catch (err) {
    throw new ContractError("envelope", `is not JSON: ${/** @type {Error} */ (err).message}`);
  }
  check(depth(v) <= LIMITS.depth, "envelope", `is nested deeper than ${LIMITS.depth} levels`);
  return v;
}

/** @param {unknown} v @returns {number} */
function depth(v) {
  if (v === null || typeof v !== "object") return 0;
  let d = 0;
  for (const x of Object.values(v)) d = Math.max(d, depth(x));
  return d + 1;
}

/** @param {unknown} v @returns {v is Record<string, any>} */
function isObject(v) {
  return v !== null && typeof v === "object" && !Array.isArray(v);
}

/** Unknown fields are errors, not ignored typos. @param {Record<string, any>} obj @param {Set<string>} known @param {string} where */
function noUnknown(obj, known, where) {
  for (const k of Object.keys(obj)) check(known.has(k), where ? `${where}.${k}` : k, "is not a known field");
}

/** @param {unknown} s */
function noNUL(s) {
  return typeof s === "string" && !s.includes("\u0000");
}

const ENVELOPE_FIELDS = new Set(["specversion", "id", "source", "type", "time", "subject", "datacontenttype", "data"]);

/** @param {any} env @returns {Envelope} */
function checkEnvelope(env) {
  check(isObject(env), "envelope", "is not a JSON object");
  noUnknown(env, ENVELOPE_FIELDS, "");
  check(env.specversion === "1.0", "specversion", 'must be "1.0"');
  check(typeof env.id === "string" && env.id.length > 0 && env.id.length <= 320 && noNUL(env.id), "id", "is required and at most 320 characters");
  check(typeof env.source === "string" && env.source.length > 0 && env.source.length <= 256 && noNUL(env.source), "source", "is required and at most 256 characters");
  check(typeof env.type === "string" && env.type.length > 0 && env.type.length <= 128 && noNUL(env.type), "type", "is required and at most 128 characters");
  check(typeof env.time === "string" && TIME_RE.test(env.time) && !Number.isNaN(Date.parse(env.time)), "time", "is required (RFC 3339)");
  for (const f of ["subject", "datacontenttype"]) {
    check(env[f] === undefined || (typeof env[f] === "string" && noNUL(env[f])), f, "must be a string");
  }
  check(isObject(env.data), "data", "is required and must be an object");
  return /** @type {Envelope} */ (env);
}

/** @param {Record<string, any>} d */
function checkWork(d) {
  if (d.max_retries !== undefined) {
    check(Number.isInteger(d.max_retries) && d.max_retries >= 0 && d.max_retries <= LIMITS.maxRetries, "data.max_retries", "must be an integer 0-1000");
  }
  check(d.retry_enabled === undefined || typeof d.retry_enabled === "boolean", "data.retry_enabled", "must be a boolean");
  if (d.timeout_ms !== undefined) {
    check(Number.isInteger(d.timeout_ms) && d.timeout_ms >= 0 && d.timeout_ms <= LIMITS.maxTimeoutMS, "data.timeout_ms", "must be an integer 0-86400000");
  }
  for (const f of ["payload", "checkpoint"]) {
    if (d[f] !== undefined) check(Buffer.byteLength(JSON.stringify(d[f])) <= LIMITS.dataBytes, `data.${f}`, `is larger than ${LIMITS.dataBytes} bytes`);
  }
  if (d.metadata !== undefined) {
    check(isObject(d.metadata), "data.metadata", "must be an object of strings");
    const entries = Object.entries(d.metadata);
    check(entries.length <= LIMITS.metadataEntries, "data.metadata", "has more than 32 entries");
    for (const [k, v] of entries) {
      check(k.length >= 1 && k.length <= 64 && typeof v === "string" && v.length <= 1024 && noNUL(k) && noNUL(v), "data.metadata", `entry ${JSON.stringify(k)}: keys are 1 to 64 characters, values strings of at most 1024`);
    }
  }
  check(d.priority === undefined || d.priority === "high" || d.priority === "normal" || d.priority === "low", "data.priority", 'must be "high", "normal" or "low"');
}

/** @param {unknown} attempt @param {string} field */
function checkAttempt(attempt, field) {
  check(Number.isInteger(attempt) && /** @type {number} */ (attempt) >= 1 && /** @type {number} */ (attempt) <= LIMITS.maxAttempt, field, "must be an integer from 1 to 1000000");
}

const JOB_FIELDS = new Set(["id", "job_type", "attempt", "priority", "payload", "checkpoint", "max_retries", "retry_enabled", "timeout_ms", "metadata"]);

/**
 * Decodes a job message from jobs.<job_type> or jobs.<job_type>.<band>
 * strictly, as pkg/contract.DecodeJob does.
 * @param {string} subject
 * @param {Uint8Array} body
 * @returns {{ envelope: Envelope, job: JobData }}
 */
export function decodeJob(subject, body) {
  const parts = subject.split(".");
  check(parts[0] === "jobs" && (parts.length === 2 || (parts.length === 3 && (parts[2] === "high" || parts[2] === "low"))), "subject", `${JSON.stringify(subject)} is not jobs.<job_type>[.high|.low]`);
  const band = parts.length === 3 ? parts[2] : "normal";
  const envelope = checkEnvelope(parseBody(body));
  const d = envelope.data;
  noUnknown(d, JOB_FIELDS, "data");
  check(typeof d.id === "string" && ID_RE.test(d.id), "data.id", "must be 1-128 characters of [A-Za-z0-9_-]");
  check(typeof d.job_type === "string" && TOKEN_RE.test(d.job_type), "data.job_type", "must be a token [a-z0-9][a-z0-9_-]*, at most 64");
  check(d.job_type === parts[1], "data.job_type", `${JSON.stringify(d.job_type)} does not match subject job type ${JSON.stringify(parts[1])}`);
  checkAttempt(d.attempt, "data.attempt");
  checkWork(d);
  check((d.priority ?? "normal") === band, "data.priority", `does not match the subject's band ${JSON.stringify(band)}`);
  return { envelope, job: /** @type {JobData} */ (d) };
}

/**
 * Gives a job a periodic schedule fired the id of its tick, as
 * pkg/contract.FiredJobID does (docs/worker-sdk.md, "Jobs fired by a
 * schedule"): a periodic schedule fires the same body every tick, so the
 * tick's job is "<data.id>-<its stream sequence in JOBS>". A job without
 * the Nats-Scheduler header, or a delayed one (Nats-Schedule-Next
 * "purge"), keeps its id.
 * @param {JobData} job
 * @param {string | undefined} scheduler the Nats-Scheduler header
 * @param {string | undefined} next the Nats-Schedule-Next header
 * @param {number} seq the message's stream sequence in JOBS
 * @returns {JobData}
 */
export function nameFired(job, scheduler, next, seq) {
  if (!scheduler || next === "purge") {
    return job;
  }
  const id = `${job.id}-${seq}`;
  check(ID_RE.test(id), "data.id", "a tick's id must be 1-128 characters of [A-Za-z0-9_-]");
  return { ...job, id };
}

const DUE_FIELDS = new Set(["kind", "id", "attempt", "next_attempt_at", "job_type", "source", "payload", "checkpoint", "metadata", "max_retries", "retry_enabled", "timeout_ms", "priority"]);

/**
 * Decodes a due event from retry.job.due.<id> strictly and returns the job
 * it asks for (docs/worker-sdk.md, "3. Route due events").
 * @param {string} subject
 * @param {Uint8Array} body
 * @param {string | undefined} msgID the message's Nats-Msg-Id header
 * @returns {JobData}
 */
export function dueToJob(subject, body, msgID) {
  const parts = subject.split(".");
  check(parts.length === 4 && parts[0] === "retry" && parts[1] === "job" && parts[2] === "due" && ID_RE.test(parts[3]), "subject", `${JSON.stringify(subject)} is not retry.job.due.<id>`);
  const envelope = checkEnvelope(parseBody(body));
  check(envelope.type === "retry.due", "type", `${JSON.stringify(envelope.type)} does not match subject event "due"`);
  const d = envelope.data;
  noUnknown(d, DUE_FIELDS, "data");
  check(d.kind === "job" && d.id === parts[3], "data", "kind/id do not match the subject");
  checkAttempt(d.attempt, "data.attempt");
  check(typeof d.job_type === "string" && TOKEN_RE.test(d.job_type), "data.job_type", "is required to route a job due event");
  check(d.source === undefined || (typeof d.source === "string" && TOKEN_RE.test(d.source)), "data.source", "must be a token");
  check(d.next_attempt_at === undefined || (typeof d.next_attempt_at === "string" && TIME_RE.test(d.next_attempt_at)), "data.next_attempt_at", "must be an RFC 3339 time");
  checkWork(d);
  check(msgID === undefined || msgID === jobMsgID(d.id, d.attempt), "Nats-Msg-Id", "does not match the due's id and attempt");
  // The job carries what the due gives back; kind, source and
  // next_attempt_at are the due's own and not fields of a job.
  /** @type {JobData} */
  const job = { id: d.id, job_type: d.job_type, attempt: d.attempt };
  for (const f of /** @type {const} */ (["priority", "payload", "checkpoint", "max_retries", "retry_enabled", "timeout_ms", "metadata"])) {
    if (d[f] !== undefined) job[f] = d[f];
  }
  if (job.priority === "normal") delete job.priority;
  return job;
}

// ---------------------------------------------------------------- building

/** @param {string} source @param {string} id @param {string} type @param {object} data @param {Date} now @param {string} [subject] */
function envelope(source, id, type, data, now, subject) {
  /** @type {Envelope} */
  const env = { specversion: "1.0", id, source, type, time: now.toISOString(), ...(subject ? { subject } : {}), datacontenttype: "application/json", data };
  const body = JSON.stringify(env);
  check(Buffer.byteLength(body) <= LIMITS.envelopeBytes - 512, "envelope", "is larger than the 1 MiB a stream stores");
  return body;
}

/**
 * A job message: a new job (attempt 1) or a due routed as a job.
 * @param {string} source @param {JobData} job @param {Date} now
 * @returns {OutgoingMsg}
 */
export function jobMsg(source, job, now) {
  const msgID = jobMsgID(job.id, job.attempt);
  return {
    subject: jobSubject(job.job_type, job.priority),
    msgID,
    headers: { "Content-Type": "application/json", "Retryd-Kind": "job", "Retryd-Item-Id": job.id, "Retryd-Attempt": String(job.attempt) },
    body: envelope(source, msgID, "job.requested", job, now),
  };
}

/**
 * A lifecycle fact of a job: retry.job.<event>.<id>, Nats-Msg-Id
 * job-<event>:<id>:<attempt>, type retry.<event>, subject job/<id>.
 * @param {string} source @param {"failed" | "succeeded" | "held"} event @param {{ id: string, attempt: number } & Record<string, any>} data @param {Date} now
 * @returns {OutgoingMsg}
 */
export function lifecycleMsg(source, event, data, now) {
  const msgID = lifecycleMsgID(event, data.id, data.attempt);
  return {
    subject: `retry.job.${event}.${data.id}`,
    msgID,
    headers: { "Content-Type": "application/json", "Retryd-Kind": "job", "Retryd-Item-Id": data.id, "Retryd-Attempt": String(data.attempt), "Retryd-Event": event },
    body: envelope(source, msgID, `retry.${event}`, { kind: "job", ...data }, now, `job/${data.id}`),
  };
}

/**
 * Cuts text to at most `max` bytes of UTF-8 without NUL characters, as the
 * scheduler stores error messages.
 * @param {string} s @param {number} [max]
 */
export function reportable(s, max = LIMITS.messageBytes) {
  const out = s.replaceAll("\u0000", "\uFFFD");
  const b = Buffer.from(out);
  if (b.length <= max) return out;
  // Back up to the start of the UTF-8 sequence the cut would split.
  let cut = max;
  while (cut > 0 && (b[cut] & 0xc0) === 0x80) cut--;
  return b.subarray(0, cut).toString("utf8");
}

/**
 * The data of a failed fact for attempt `job.attempt`: the error, and what
 * the retry needs back from the scheduler (docs/worker-sdk.md, "2. Run it and
 * report"): job type, payload, latest checkpoint, metadata, the job's
 * overrides and its band.
 * @param {JobData} job
 * @param {unknown} checkpoint
 * @param {{ class?: string, message: string, nonRetryable?: boolean, retryAfter?: number }} err
 * @param {string} executor
 */
export function failedData(job, checkpoint, err, executor) {
  /** @type {Record<string, any>} */
  const error = { message: reportable(err.message) };
  if (err.class) error.class = err.class;
  if (err.nonRetryable) error.non_retryable = true;
  /** @type {{ id: string, attempt: number } & Record<string, any>} */
  const d = { id: job.id, attempt: job.attempt, error };
  if (err.retryAfter !== undefined) d.retry_after = Math.max(0, Math.ceil(err.retryAfter));
  d.job_type = job.job_type;
  for (const f of /** @type {const} */ (["max_retries", "retry_enabled", "timeout_ms", "priority", "payload"])) {
    if (job[f] !== undefined) d[f] = job[f];
  }
  if (checkpoint !== undefined) d.checkpoint = checkpoint;
  if (job.metadata !== undefined) d.metadata = job.metadata;
  if (executor) d.executor = executor;
  return d;
}

/** @param {JobData} job @param {string} executor */
export function succeededData(job, executor) {
  /** @type {{ id: string, attempt: number } & Record<string, any>} */
  const d = { id: job.id, attempt: job.attempt };
  if (job.metadata !== undefined) d.metadata = job.metadata;
  if (executor) d.executor = executor;
  return d;
}

/** A new job id: time-ordered (base 36 milliseconds) and subject-safe. */
export function newJobID() {
  return Date.now().toString(36).padStart(10, "0") + randomBytes(10).toString("hex");
}
