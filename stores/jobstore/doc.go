// Package jobstore is the Postgres side of the jobs projection: the jobs
// table with each job's status, retries, last error and current step,
// folded from the JOBS and RETRIES streams, the queries behind the jobs API
// (lists, one job, retry analytics) and the bulk retry operations.
//
// The fold is ordering-safe. The two streams are read by two consumers, so
// the facts of one job can arrive in any order; each fact has a position,
// attempt × 8 + rank (scheduled 1, job message 2, failed 3, succeeded or
// exhausted 4, cancelled 5), and only a fact newer than the row's position
// moves its status. Older facts still fill in fields the row lacks (job
// type, creation time, an error from a failure seen late). Duplicates are
// the caller's business (inbox): applying a fact twice is harmless anyway.
//
// Every function takes a Querier, so it runs on a pool or inside the
// caller's transaction.
package jobstore

import (
	"github.com/retryd/retryd/stores/pgdb"
)

// Querier is a *pgxpool.Pool, a *pgx.Conn or a pgx.Tx.
type Querier = pgdb.DB
