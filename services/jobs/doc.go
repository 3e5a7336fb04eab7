// Package jobs runs the jobs side of retryd: the Projector that folds the
// JOBS and RETRIES streams into the jobs table (status, retry count, last
// error, next retry, current step), and the API that serves job lists, job
// history, retry analytics, manual retry and cancel, and rate-limited bulk
// retries. The jobs table holds every job published on JOBS, those whose
// first attempt worked too, which success rates and attempts-to-success
// analytics need and the retries projection (items that failed) lacks.
//
// The package does not import the scheduler: manual retries and cancels go
// through a RetryController, which the binary that hosts both wires to the
// scheduler with a small adapter (docs/jobs.md shows it).
package jobs
