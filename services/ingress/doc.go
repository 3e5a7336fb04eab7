// Package ingress is retryd's edge: it takes producer events over HTTP and
// NATS, passes them through each source's gate (rate limit, pause, allowed
// types) and admits them to events.<source>.<type> exactly once per event
// id. Events a throttled or paused source rejects are deferred, never
// dropped: ingress publishes retry.event.held.<eventId> (a hold uses none
// of the event's retries), the scheduler brings them back as
// retry.event.due.<eventId> when the window or pause ends, or at once on
// retry.event.released.<source> after a resume or a limit change, and
// ingress evaluates the source again.
//
// The pieces, each a durable JetStream consumer or an HTTP route:
//
//   - Intake: POST /v1/events and POST /v1/events:batch validate, publish to
//     ingest.<source> with Nats-Msg-Id = event id and answer 202 after the
//     PubAck. Producers may also publish to ingest.<source> themselves.
//   - Gate (consumer ingress-gate on INGEST): stores the event in
//     workflow_events and admits or defers it, in one transaction with the
//     inbox claim and the outbox messages.
//   - Retry (consumer ingress-retry on retry.event.due.*): evaluates a
//     deferred event again and publishes succeeded, or held again.
//   - Retry state (consumer ingress-retry-state): keeps
//     event_ingress_retries in step with the scheduler's scheduled,
//     rescheduled, exhausted and cancelled events.
//   - Reconciler: publishes again the held event of deferrals the
//     scheduler never confirmed (a purged RETRIES stream).
//   - Operator API: /v1/sources and /v1/events/{id}.
//
// Everything that must be published after a state change goes through the
// transactional outbox and the service's relay, so a crash between commit
// and publish loses nothing; every consumer claims its messages in the
// inbox, so a message delivered twice changes nothing.
package ingress
