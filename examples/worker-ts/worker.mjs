// @ts-check
// A retryd job worker over NATS JetStream, written from the documented wire
// protocol only (docs/worker-sdk.md, "The protocol (for any language)"):
//
//   1. one durable pull consumer per job type and priority band on JOBS
//      (worker-<type>=high, worker-<type>, worker-<type>=low), pulled in
//      that order whenever a slot is free;
//   2. each attempt reports exactly one outcome, retry.job.succeeded.<id> or
//      retry.job.failed.<id> (with the checkpoint), and waits for the
//      stream's ack before it acks the job;
//   3. the shared durable worker-due-router on RETRIES republishes every
//      retry.job.due.<id> as a job on jobs.<type>[.band], with the due's id.

import { Buffer } from "node:buffer";
import { hostname } from "node:os";
import { connect, headers as natsHeaders } from "@nats-io/transport-node";
import { AckPolicy, DeliverPolicy, jetstream, jetstreamManager } from "@nats-io/jetstream";
import * as protocol from "./protocol.mjs";

/** @typedef {import("@nats-io/jetstream").JsMsg} JsMsg */
/** @typedef {import("@nats-io/jetstream").Consumer} Consumer */
/** @typedef {import("@nats-io/jetstream").ConsumerConfig} ConsumerConfig */
/** @typedef {import("./protocol.mjs").JobData} JobData */
/** @typedef {import("./protocol.mjs").Priority} Priority */

/**
 * An error that names its class. Retried by default: timeout, network,
 * rate_limit, temporary, unknown; not retried: authentication, permission,
 * validation (the job type's policy decides). nonRetryable makes the
 * failure final whatever the class; retryAfter (seconds) asks the scheduler
 * to wait that long.
 */
export class JobError extends Error {
  /**
   * @param {string} errorClass one of protocol.CLASSES
   * @param {string} message
   * @param {{ nonRetryable?: boolean, retryAfter?: number }} [opts]
   */
  constructor(errorClass, message, opts = {}) {
    if (!/^[a-z0-9][a-z0-9_-]{0,63}$/.test(errorClass)) throw new TypeError(`error class ${JSON.stringify(errorClass)} is not a token`);
    super(message);
    this.name = "JobError";
    this.errorClass = errorClass;
    this.nonRetryable = opts.nonRetryable ?? false;
    this.retryAfter = opts.retryAfter;
  }
}

/**
 * What a handler gets.
 * @typedef {object} Job
 * @property {string} id the job id, the same on every attempt
 * @property {string} type
 * @property {number} attempt 1 on the first run, +1 per retry
 * @property {any} payload the job's input, unchanged across attempts
 * @property {any} checkpoint on a retry, what the failed attempt recorded
 * @property {Record<string, string> | undefined} metadata
 * @property {Priority} priority
 * @property {string} idempotencyKey "<id>:<attempt>"
 * @property {(v: unknown) => void} setCheckpoint records progress (JSON, at most 512 KiB); sent with a failure
 * @property {(msg: string, fields?: Record<string, unknown>) => void} log
 */

/** @typedef {(job: Job, signal: AbortSignal) => Promise<void>} Handler */

/**
 * @typedef {object} Config
 * @property {string[]} servers
 * @property {string} [user]
 * @property {string} [pass]
 * @property {string} [token]
 * @property {string} [inboxPrefix] _INBOX_worker for the shipped NATS user "worker"
 * @property {string} source the envelope source of what it publishes
 * @property {string} executor the instance name sent on outcomes
 * @property {number} concurrency jobs of each type at once
 * @property {number} timeoutMS a job's timeout when it has no timeout_ms
 * @property {number} ackWaitMS the consumers' ack wait; in-progress acks every third of it
 * @property {number} fetchMS how long one pull waits (at least 1000)
 * @property {boolean} routeDues run the due router in this process
 * @property {(entry: Record<string, unknown>) => void} log
 */

const BANDS = /** @type {const} */ (["high", "normal", "low"]);
const PUBLISH_ATTEMPTS = 5;
const ROUTER_BATCH = 64;

/** The configuration from the environment (README.md). @returns {Config} */
export function configFromEnv(env = process.env) {
  const num = (/** @type {string} */ k, /** @type {number} */ d) => {
    const v = env[k];
    if (v === undefined || v === "") return d;
    const n = Number(v);
    if (!Number.isInteger(n) || n <= 0) throw new Error(`${k}=${v} is not a positive integer`);
    return n;
  };
  const executor = Buffer.from(`${hostname()}-${process.pid}`).subarray(0, 64).toString("utf8");
  return {
    servers: (env.NATS_URL || "nats://127.0.0.1:4222").split(","),
    user: env.NATS_USER || undefined,
    pass: env.NATS_PASSWORD || undefined,
    token: env.NATS_TOKEN || undefined,
    inboxPrefix: env.NATS_INBOX_PREFIX || undefined,
    source: env.WORKER_SOURCE || "worker-ts",
    executor: env.WORKER_EXECUTOR || executor,
    concurrency: num("WORKER_CONCURRENCY", 4),
    timeoutMS: num("WORKER_TIMEOUT_MS", 5 * 60_000),
    ackWaitMS: num("WORKER_ACK_WAIT_MS", 30_000),
    fetchMS: Math.max(1000, num("WORKER_FETCH_MS", 1000)),
    routeDues: env.WORKER_ROUTE_DUES !== "false",
    log: (entry) => process.stdout.write(JSON.stringify({ time: new Date().toISOString(), ...entry }) + "\n"),
  };
}

/** @param {number} ms */
const sleep = (ms) => new Promise((r) => setTimeout(r, ms));

/** @param {unknown} err */
function isNotFound(err) {
  const e = /** @type {any} */ (err);
  const code = e?.code ?? e?.api_error?.err_code;
  return code === 10014 || code === 10059 || code === 404 || /not found/i.test(String(e?.message));
}

/** Slots of one job type: at most `size` jobs run at once. */
class Slots {
  /** @param {number} size */
  constructor(size) {
    this.size = size;
    this.used = 0;
    /** @type {(() => void)[]} */
    this.waiters = [];
  }
  free() {
    return this.size - this.used;
  }
  take() {
    this.used++;
  }
  release() {
    this.used--;
    this.wake();
  }
  wake() {
    for (const w of this.waiters.splice(0)) w();
  }
  /** Resolves when a slot is free, or when wake is called. */
  async waitFree() {
    if (this.free() <= 0) await new Promise((r) => this.waiters.push(() => r(undefined)));
  }
  /** Resolves when no job runs. */
  async idle() {
    while (this.used > 0) await new Promise((r) => this.waiters.push(() => r(undefined)));
  }
}

/**
 * Connects, creates the consumers it needs and starts pulling.
 * @param {Config} cfg
 * @param {Record<string, Handler>} handlers by job type
 */
export async function startWorker(cfg, handlers) {
  const log = cfg.log;
  const nc = await connect({
    servers: cfg.servers,
    user: cfg.user,
    pass: cfg.pass,
    token: cfg.token,
    inboxPrefix: cfg.inboxPrefix,
    name: cfg.source,
    maxReconnectAttempts: -1,
  });
  const js = jetstream(nc);
  const jsm = await jetstreamManager(nc, { checkAPI: false });
  let stopping = false;
  /** @type {Set<AbortController>} */
  const running = new Set();
  /** @type {Slots[]} */
  const allSlots = [];

  /**
   * Creates a durable consumer unless it exists; an existing one is used as
   * it is (another worker, or the Go SDK, may share it).
   * @param {string} stream @param {Partial<ConsumerConfig> & { durable_name: string }} config
   * @returns {Promise<Consumer>}
   */
  async function ensureConsumer(stream, config) {
    for (;;) {
      try {
        try {
          await jsm.consumers.info(stream, config.durable_name);
        } catch (err) {
          if (!isNotFound(err)) throw err;
          await jsm.consumers.add(stream, config);
          log({ level: "info", msg: "consumer created", stream, consumer: config.durable_name });
        }
        return await js.consumers.get(stream, config.durable_name);
      } catch (err) {
        if (stopping) throw err;
        log({ level: "warn", msg: "cannot create consumer; trying again", stream, consumer: config.durable_name, error: String(err) });
        await sleep(1000);
      }
    }
  }

  /**
   * Publishes a message and waits for the stream's ack, trying again with
   * doubling pauses; the same Nats-Msg-Id makes a repeat a duplicate.
   * @param {import("./protocol.mjs").OutgoingMsg} out
   */
  async function publish(out) {
    const h = natsHeaders();
    for (const [k, v] of Object.entries(out.headers)) h.set(k, v);
    let pause = 100;
    let last;
    for (let i = 0; i < PUBLISH_ATTEMPTS; i++) {
      if (i > 0) {
        await sleep(pause);
        pause *= 2;
      }
      try {
        return await js.publish(out.subject, out.body, { msgID: out.msgID, headers: h, timeout: 5000 });
      } catch (err) {
        last = err;
      }
    }
    throw last;
  }

  /** @param {string} type @param {Priority} band @param {JsMsg} m */
  async function runJob(type, band, m) {
    let data;
    try {
      data = protocol.nameFired(protocol.decodeJob(m.subject, m.data).job,
        m.headers?.get("Nats-Scheduler"), m.headers?.get("Nats-Schedule-Next"), m.seq);
    } catch (err) {
      // Malformed: terminated with the reason, never redelivered.
      m.term(String(/** @type {Error} */ (err).message).slice(0, 200));
      log({ level: "warn", msg: "malformed job terminated", subject: m.subject, error: String(err) });
      return;
    }
    const d = data;
    const jl = (/** @type {string} */ msg, /** @type {Record<string, unknown>} */ fields = {}) =>
      log({ level: "info", msg, job_type: type, id: d.id, attempt: d.attempt, ...fields });
    let latest = d.checkpoint;
    /** @type {Job} */
    const job = {
      id: d.id,
      type: d.job_type,
      attempt: d.attempt,
      payload: d.payload,
      checkpoint: d.checkpoint,
      metadata: d.metadata,
      priority: d.priority ?? band,
      idempotencyKey: `${d.id}:${d.attempt}`,
      setCheckpoint(v) {
        const raw = JSON.stringify(v);
        if (raw === undefined || Buffer.byteLength(raw) > protocol.LIMITS.dataBytes) {
          throw new Error("checkpoint must be JSON of at most 512 KiB");
        }
        latest = JSON.parse(raw);
      },
      log: jl,
    };
    jl("attempt", { checkpoint: d.checkpoint ?? null, redelivered: m.info.redelivered });

    const ac = new AbortController();
    running.add(ac);
    const timeoutMS = d.timeout_ms || cfg.timeoutMS;
    const timer = setTimeout(() => ac.abort(new JobError("timeout", `attempt timed out after ${timeoutMS}ms`)), timeoutMS);
    const progress = setInterval(() => m.working(), Math.max(1000, Math.floor(cfg.ackWaitMS / 3)));
    /** @type {JobError | Error | undefined} */
    let failure;
    try {
      const aborted = new Promise((_, reject) => ac.signal.addEventListener("abort", () => reject(ac.signal.reason), { once: true }));
      await Promise.race([handlers[type](job, ac.signal), aborted]);
    } catch (err) {
      failure = err instanceof Error ? err : new Error(String(err));
    } finally {
      clearTimeout(timer);
      running.delete(ac);
    }
    try {
      if (failure?.name === "Interrupted") {
        // A forced stop: handed back without a report, to run again at once.
        m.nak();
        jl("interrupted");
        return;
      }
      let out;
      if (failure === undefined) {
        out = protocol.lifecycleMsg(cfg.source, "succeeded", protocol.succeededData(d, cfg.executor), new Date());
      } else {
        const je = failure instanceof JobError ? failure : undefined;
        const report = { class: je?.errorClass, message: failure.message, nonRetryable: je?.nonRetryable, retryAfter: je?.retryAfter };
        out = protocol.lifecycleMsg(cfg.source, "failed", protocol.failedData(d, latest, report, cfg.executor), new Date());
      }
      try {
        const ack = await publish(out);
        m.ack();
        jl("outcome", { outcome: failure ? "failed" : "succeeded", class: failure instanceof JobError ? failure.errorClass : "", error: failure?.message, checkpoint: failure ? latest ?? null : undefined, msg_id: out.msgID, duplicate: ack.duplicate });
      } catch (err) {
        // No outcome stored: hand the job back to run again.
        m.nak(1000);
        jl("report failed; job handed back", { level: "warn", error: String(err) });
      }
    } finally {
      clearInterval(progress);
    }
  }

  /** One loop per job type: pulls its bands high, normal, low for the free slots. @param {string} type */
  async function typeLoop(type) {
    const configs = BANDS.map((band) => ({
      durable_name: protocol.consumerName(type, band),
      description: `retryd worker-ts: runs ${band} priority jobs of type ${type}`,
      filter_subject: protocol.jobSubject(type, band),
      deliver_policy: DeliverPolicy.All,
      ack_policy: AckPolicy.Explicit,
      ack_wait: cfg.ackWaitMS * 1_000_000,
      max_ack_pending: cfg.concurrency,
      max_deliver: -1,
    }));
    /** @type {Consumer[]} */
    const consumers = [];
    for (const c of configs) consumers.push(await ensureConsumer(protocol.STREAM_JOBS, c));
    const slots = new Slots(cfg.concurrency);
    allSlots.push(slots);
    return async () => {
      while (!stopping) {
        await slots.waitFree();
        for (let i = 0; i < BANDS.length && !stopping && slots.free() > 0; i++) {
          try {
            const msgs = await consumers[i].fetch({ max_messages: slots.free(), expires: cfg.fetchMS });
            for await (const m of msgs) {
              slots.take();
              runJob(type, BANDS[i], m)
                .catch((err) => log({ level: "error", msg: "job failed to run", error: String(err) }))
                .finally(() => slots.release());
            }
          } catch (err) {
            if (stopping) break;
            log({ level: "warn", msg: "pull failed", job_type: type, band: BANDS[i], error: String(err) });
            await sleep(1000);
            // A deleted consumer is created again with its configuration.
            if (isNotFound(err)) consumers[i] = await ensureConsumer(protocol.STREAM_JOBS, configs[i]);
          }
        }
      }
      await slots.idle();
    };
  }

  /** The due router: retry.job.due.<id> becomes a job on jobs.<type>[.band]. */
  async function routerLoop() {
    // The Go SDK's configuration of the shared durable (docs/worker-sdk.md).
    const config = {
      durable_name: protocol.DUE_ROUTER_DURABLE,
      description: "retryd worker SDK: republishes retry.job.due.<id> as jobs.<job_type>",
      filter_subject: protocol.DUE_FILTER,
      deliver_policy: DeliverPolicy.All,
      ack_policy: AckPolicy.Explicit,
      ack_wait: 30_000 * 1_000_000,
      max_ack_pending: 1024,
      max_deliver: -1,
    };
    let c = await ensureConsumer(protocol.STREAM_RETRIES, config);
    return async () => {
      while (!stopping) {
        try {
          const msgs = await c.fetch({ max_messages: ROUTER_BATCH, expires: cfg.fetchMS });
          for await (const m of msgs) await route(m);
        } catch (err) {
          if (stopping) break;
          log({ level: "warn", msg: "due router: pull failed", error: String(err) });
          await sleep(1000);
          if (isNotFound(err)) c = await ensureConsumer(protocol.STREAM_RETRIES, config);
        }
      }
    };
  }

  /** @param {JsMsg} m */
  async function route(m) {
    let job;
    try {
      job = protocol.dueToJob(m.subject, m.data, m.headers?.get("Nats-Msg-Id") || undefined);
    } catch (err) {
      m.term(String(/** @type {Error} */ (err).message).slice(0, 200));
      log({ level: "warn", msg: "malformed due terminated", subject: m.subject, error: String(err) });
      return;
    }
    const out = protocol.jobMsg(cfg.source, job, new Date());
    try {
      await publish(out);
      m.ack();
      log({ level: "info", msg: "due routed", job_type: job.job_type, id: job.id, attempt: job.attempt, subject: out.subject, msg_id: out.msgID });
    } catch (err) {
      m.nak(1000);
      log({ level: "warn", msg: "route due: publish failed; due redelivered", id: job.id, error: String(err) });
    }
  }

  const types = Object.keys(handlers);
  for (const t of types) {
    if (!/^[a-z0-9][a-z0-9_-]{0,63}$/.test(t)) throw new Error(`job type ${JSON.stringify(t)} is not a token`);
  }
  const starts = types.map((t) => typeLoop(t));
  if (cfg.routeDues) starts.push(routerLoop());
  const loops = (await Promise.all(starts)).map((run) => run());
  log({ level: "info", msg: "ready", job_types: types, route_dues: cfg.routeDues, source: cfg.source, executor: cfg.executor });

  let stopped;
  return {
    /**
     * Stops pulling, lets running jobs finish and report, and closes the
     * connection. With force, running jobs are handed back (nak) without a
     * report instead.
     * @param {{ force?: boolean }} [opts]
     */
    stop(opts = {}) {
      stopping = true;
      for (const s of allSlots) s.wake();
      if (opts.force) {
        for (const ac of running) {
          const e = new Error("worker stopped");
          e.name = "Interrupted";
          ac.abort(e);
        }
      }
      stopped ??= (async () => {
        await Promise.all(loops);
        await nc.drain();
        log({ level: "info", msg: "stopped" });
      })();
      return stopped;
    },
    closed: nc.closed(),
  };
}
