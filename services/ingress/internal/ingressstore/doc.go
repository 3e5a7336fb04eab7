// Package ingressstore is the Postgres side of retryd's ingress: the
// workflow events as ingress stored them, the per-source gate (rate limits
// in fixed windows, pauses, allowed types) and the event_ingress_retries
// read model of deferred events.
//
// Every function takes a DB, which a pgx.Tx and a *pgxpool.Pool both
// satisfy, so the ingress service composes them with inbox claims and
// outbox inserts in one transaction. Functions that must run inside a
// transaction (the gate, row locks) take a pgx.Tx.
package ingressstore
