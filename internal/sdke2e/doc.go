// Package sdke2e holds, in its subpackages, the end-to-end tests of the
// public SDK: pkg/worker's in worker, pkg/tracing's in tracing. They run
// the SDK against an embedded NATS server with the streams retryd
// creates (internal/natstest, internal/streams), which the SDK module
// cannot import: it depends on nothing of the server module, not even in
// its tests. The SDK's unit tests stay beside its code.
package sdke2e
