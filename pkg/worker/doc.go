// Package worker is retryd's worker SDK: it runs your handlers for the jobs
// on JetStream and reports every attempt to retryd, whose scheduler decides
// on the retries.
//
// Build a Worker with New, register one Handler per job type with Handle,
// then Start; Stop drains it. The handler's error decides the attempt's
// outcome: nil reports success, an error built with pkg/errclass carries
// its class, retry-after hint and non-retryable flag, and any other error
// is classified by its message. A handler that must wait for permission (a
// downstream "not now", a per-tenant cap, a maintenance window) returns
// Hold instead: the job waits without using a retry. Enqueue submits a
// job.
//
// A job has a priority band (contract.JobData.Priority: high, normal or
// low; none is normal), each on its own subject and durable consumer. The
// bands of a type share its Config.Concurrency slots, and a free slot
// takes a waiting high job before a normal one, a normal one before a low
// one. Retries keep the job's band.
//
// Jobs are delivered at least once: the outcome is published before the job
// is acked, so a crash in between runs the attempt again. Key external
// effects with Job.IdempotencyKey, and record the progress of multi-step
// jobs with Job.SetCheckpoint; a retry starts with the checkpoint of the
// failed attempt.
//
// Logs go to Config.Logger, a *slog.Logger (nil discards them). They carry
// job ids, types, attempts, classes, consumer and subject names, never
// payloads, checkpoints or the messages of handler errors.
//
// Spans go through the OpenTelemetry API: the worker continues the trace in
// each job's headers and passes it to the handler's ctx. Nothing is
// exported until the program installs a tracer provider and a propagator
// (otel.SetTracerProvider and otel.SetTextMapPropagator, or
// pkg/tracing.Install); the SDK itself never links the OpenTelemetry SDK,
// an exporter, gRPC, the NATS server or a third-party logging library, and
// TestSDKDependenciesStayLight fails if one of them comes back.
//
// The public, supported packages are worker, contract, errclass, backoff
// and policy; every other package of the module may change without notice
// (docs/worker-sdk.md, "SDK stability").
package worker
