// @ts-check
// The example's job handlers: what a user of the worker writes. A handler
// gets the job and an AbortSignal (aborted at the job's timeout or a forced
// stop); it returns to succeed and throws to fail. Throw a JobError to name
// the error class (docs/contract.md, error classes); any other error is
// reported without a class, and the scheduler classifies its message.

import { JobError } from "./worker.mjs";

/** @typedef {import("./worker.mjs").Job} Job */

const ONBOARDING_STEPS = ["create_account", "send_welcome", "schedule_followup"];

/**
 * The handlers by job type.
 * @type {Record<string, (job: Job, signal: AbortSignal) => Promise<void>>}
 */
export const handlers = {
  // Three steps with a checkpoint after each. A payload
  // {"user":"ada","fail_at":"send_welcome"} fails at that step on the first
  // attempt with a network error; the retry starts at that step, from the
  // checkpoint the failed attempt left.
  async onboarding_ts(job, signal) {
    /** @type {{ user?: string, fail_at?: string, step_ms?: number }} */
    const p = job.payload ?? {};
    /** @type {{ step?: string } | undefined} */
    const cp = job.checkpoint;
    const start = cp?.step ? ONBOARDING_STEPS.indexOf(cp.step) + 1 : 0;
    job.log("resume", { from: ONBOARDING_STEPS[start] ?? "done", checkpoint: cp ?? null });
    for (const step of ONBOARDING_STEPS.slice(start)) {
      if (p.step_ms) await sleep(p.step_ms, signal);
      if (step === p.fail_at && job.attempt === 1) {
        throw new JobError("network", `${step}: connection reset by peer`);
      }
      // Key the step's effect by job id and step: a step that ran before a
      // crash may run again.
      job.log("step", { step, effect_key: `${job.id}:${step}` });
      job.setCheckpoint({ step });
    }
  },

  // One step that checks its input: a domain without a dot is a validation
  // error, which the policies do not retry.
  async enrich_ts(job) {
    /** @type {{ domain?: string }} */
    const p = job.payload ?? {};
    if (typeof p.domain !== "string" || !p.domain.includes(".")) {
      throw new JobError("validation", `company domain ${JSON.stringify(p.domain)} is malformed`);
    }
    job.log("step", { step: "enrich", effect_key: job.idempotencyKey });
  },
};

/** @param {number} ms @param {AbortSignal} signal @returns {Promise<void>} */
function sleep(ms, signal) {
  return new Promise((resolve, reject) => {
    if (signal.aborted) return reject(signal.reason);
    const t = setTimeout(resolve, ms);
    signal.addEventListener("abort", () => {
      clearTimeout(t);
      reject(signal.reason);
    }, { once: true });
  });
}
