// @ts-check
// The example worker: runs the handlers of handlers.mjs until SIGTERM or
// SIGINT. The first signal drains (no new jobs; running ones finish and
// report) and exits 0; a second signal, or WORKER_STOP_TIMEOUT_MS (30 s)
// without the drain ending, hands the running jobs back unreported and
// exits 1.

import { handlers } from "./handlers.mjs";
import { configFromEnv, startWorker } from "./worker.mjs";

const cfg = configFromEnv();
const stopTimeout = Number(process.env.WORKER_STOP_TIMEOUT_MS || 30_000);
const w = await startWorker(cfg, handlers);

let signals = 0;
/** @param {NodeJS.Signals} sig */
async function onSignal(sig) {
  signals++;
  if (signals > 1) {
    cfg.log({ level: "warn", msg: "second signal: handing running jobs back", signal: sig });
    await w.stop({ force: true });
    process.exit(1);
  }
  cfg.log({ level: "info", msg: "stopping: draining", signal: sig });
  const force = setTimeout(() => {
    cfg.log({ level: "warn", msg: "drain timed out: handing running jobs back" });
    w.stop({ force: true }).finally(() => process.exit(1));
  }, stopTimeout);
  await w.stop();
  clearTimeout(force);
  process.exit(0);
}
process.on("SIGTERM", onSignal);
process.on("SIGINT", onSignal);

// A connection that closes for good (not by stop) ends the process.
w.closed.then((err) => {
  if (signals === 0) {
    cfg.log({ level: "error", msg: "connection closed", error: err ? String(err) : undefined });
    process.exit(1);
  }
});
