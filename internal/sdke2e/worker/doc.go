// Package worker holds the end-to-end tests of pkg/worker (see package
// sdke2e): jobs, dues, holds, outcomes and pending failures through an
// embedded NATS with retryd's streams.
package worker
