// Package jobs runs the jobs side of retryd: the Projector that folds the
// JOBS and RETRIES streams into the jobs table (seed 003/004 statuses and
// fields), and the API that serves job lists, job history, retry analytics,
// manual retry and cancel, and rate-limited bulk retries.
//
// The package does not import the scheduler: manual retries and cancels go
// through a RetryController, which the binary that hosts both wires to the
// scheduler with a small adapter (docs/jobs.md shows it).
package jobs
