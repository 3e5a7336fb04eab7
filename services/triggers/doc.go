// Package triggers is retryd's triggers service: it turns admitted events
// into workflow runs, at most one per event and trigger. It offers every admitted
// event (EVENTS, events.<source>.<type>) to the triggers of its source and
// type, evaluates each trigger's CEL predicate, throttle and max
// concurrency, and records one delivery per event and trigger in
// workflow_trigger_deliveries.
//
// A delivery that may launch requests its run on
// runs.<workflow>.requested.<run_id>. The run id is derived from the
// delivery, so a delivery launches at most one run. A delivery held back by
// the throttle or by max concurrency becomes a durable retry that uses none
// of its retries: the service publishes
// retry.event-trigger.held.<delivery_id> (with the time a slot frees as until
// for a throttle), and the scheduler brings it back on
// retry.event-trigger.due.<delivery_id>. A completed or failed run frees
// its concurrency slot and publishes retry.event-trigger.released.<trigger_id>
// (slot_freed, count 1), which releases the delivery that waited longest.
//
// State changes and the messages they publish are committed together
// (inbox, outbox). Every delivery decision takes the trigger's row lock,
// so several instances can share the database and the durable consumers.
//
// Build a Service with New, run it with Start and Stop, and mount Handler
// for the trigger API. docs/triggers.md is the user guide.
package triggers
