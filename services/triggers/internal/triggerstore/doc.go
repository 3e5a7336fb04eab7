// Package triggerstore is the Postgres side of retryd's triggers service:
// trigger definitions and their versions, the deliveries of events to
// triggers (launched, filtered, held back by a throttle or max concurrency,
// cancelled, exhausted) with their retry columns, and the workflow runs the
// deliveries launched.
//
// Every function takes a DB, which a pgx.Tx and a *pgxpool.Pool both
// satisfy, so the service composes them with inbox claims and outbox
// inserts in one transaction. The limit checks (LockTrigger,
// NthRecentLaunch, CountInFlight) are only meaningful inside the
// transaction that holds the trigger's row lock: that lock is what makes
// several service instances agree on a trigger's throttle and concurrency.
package triggerstore
