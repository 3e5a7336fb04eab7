// Command retryd is retryd's all-in-one dev runner and operator CLI: the
// one binary a developer runs to get the whole pipeline on one machine, and
// an operator uses to ask why an item retried and to act on it.
//
//	retryd dev --demo                      run everything in one process, with demo traffic
//	retryd retries list --state exhausted  operate a running retryd through its HTTP API
//	retryd simulate --kind job --job-type send_email
//	retryd migrate                         apply the schema (DATABASE_URL)
//	retryd streams export --dir deploy/streams
//
// Exit codes: 0 success, 1 the operation failed (API error, not found,
// unreachable server), 2 usage error (unknown command, bad flag or
// argument). See docs/cli.md.
package main

import (
	"context"
	"io"
	"os"
)

// version is set at build time: -ldflags "-X main.version=v1.2.3".
var version = "dev"

func main() {
	os.Exit(run(context.Background(), os.Args[1:], os.Stdout, os.Stderr))
}

// run executes the command line args and returns the exit code. It is
// main without os.Exit, so tests run commands in-process.
func run(ctx context.Context, args []string, stdout, stderr io.Writer) int {
	root := newRootCmd(stdout, stderr)
	root.SetArgs(args)
	err := root.ExecuteContext(ctx)
	return report(err, stderr)
}
