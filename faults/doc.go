// Package faults is retryd's fault and bad-input suite: the scenarios of
// docs/reliability.md, each a test that runs the real service binaries as
// separate processes against a nats-server process and Postgres, injects
// a fault under load and checks with exact counts that nothing was lost
// and nothing was doubled.
//
// go test runs the short version (small counts, a few minutes in all);
// RETRYD_FAULTS=full runs every scenario at the full size docs/reliability.md
// gives for it (make faults; CI runs both):
//
//	RETRYD_FAULTS=full go test -timeout 60m -v github.com/retryd/retryd/faults/...
package faults
