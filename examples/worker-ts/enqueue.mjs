// @ts-check
// Submits jobs as docs/worker-sdk.md, "4. Submit jobs", writes: a job
// message with attempt 1 on jobs.<type> (or .high / .low), Nats-Msg-Id
// job:<id>:1. Prints the ids, one a line.
//
//   node enqueue.mjs <job_type> '<payload JSON>' [count] [high|normal|low]

import { connect, headers as natsHeaders } from "@nats-io/transport-node";
import { jetstream } from "@nats-io/jetstream";
import { jobMsg, newJobID } from "./protocol.mjs";

const [type, payloadJSON = "{}", countArg = "1", priority = "normal"] = process.argv.slice(2);
if (!type || !/^[a-z0-9][a-z0-9_-]{0,63}$/.test(type) || !["high", "normal", "low"].includes(priority)) {
  console.error("usage: node enqueue.mjs <job_type> '<payload JSON>' [count] [high|normal|low]");
  process.exit(2);
}
const nc = await connect({
  servers: (process.env.NATS_URL || "nats://127.0.0.1:4222").split(","),
  user: process.env.NATS_USER || undefined,
  pass: process.env.NATS_PASSWORD || undefined,
  token: process.env.NATS_TOKEN || undefined,
  inboxPrefix: process.env.NATS_INBOX_PREFIX || undefined,
});
const js = jetstream(nc);
for (let i = 0; i < Number(countArg); i++) {
  /** @type {import("./protocol.mjs").JobData} */
  const job = { id: newJobID(), job_type: type, attempt: 1, payload: JSON.parse(payloadJSON) };
  if (priority !== "normal") job.priority = /** @type {"high" | "low"} */ (priority);
  const out = jobMsg(process.env.WORKER_SOURCE || "worker-ts-enqueue", job, new Date());
  const h = natsHeaders();
  for (const [k, v] of Object.entries(out.headers)) h.set(k, v);
  await js.publish(out.subject, out.body, { msgID: out.msgID, headers: h });
  console.log(job.id);
}
await nc.drain();
