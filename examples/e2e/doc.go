// Package e2e holds end-to-end tests of retryd's jobs path: the worker
// SDK, the real scheduler, the jobs projection and the jobs API in one
// process, over embedded NATS and a fresh Postgres database per test.
package e2e
