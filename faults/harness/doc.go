// Package harness runs retryd the way it runs in production, as separate
// processes, and injects faults into it: the service binaries built from
// this checkout, a nats-server built from the nats-server/v2 module (file
// storage, sync_interval always), a Postgres cluster that can be stopped
// fast or immediately and started again on the same data directory, and a
// recorder that counts every side effect by (kind, id, attempt), by event
// id and by run id.
//
// Load goes in only through the public contract (HTTP and NATS
// publishes); the invariants are checked on what comes out (the streams,
// the effects the owners recorded) and on the Postgres projections.
package harness
