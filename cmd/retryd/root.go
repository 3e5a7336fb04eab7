package main

import (
	"errors"
	"fmt"
	"io"
	"os"
	"strings"
	"time"

	"github.com/spf13/cobra"
)

// Exit codes.
const (
	exitOK     = 0
	exitFailed = 1
	exitUsage  = 2
)

// Environment variables of the CLI.
const (
	envAPI         = "RETRYD_API"
	envToken       = "RETRYD_TOKEN"
	envCAFile      = "RETRYD_CA_FILE"
	defaultAPI     = "http://127.0.0.1:8080"
	defaultTimeout = 30 * time.Second
)

// globals are the flags every command shares.
type globals struct {
	api     string
	token   string
	caFile  string
	context string // --context: a saved context by name
	config  string // --config: the file of saved contexts
	json    bool
	timeout time.Duration
	stdout  io.Writer
	stderr  io.Writer
}

func newRootCmd(stdout, stderr io.Writer) *cobra.Command {
	g := &globals{stdout: stdout, stderr: stderr}
	root := &cobra.Command{
		Use:   "retryd",
		Short: "Durable retries over NATS JetStream: dev runner and operator CLI",
		Long: `retryd runs the whole retry pipeline on your machine (retryd dev) and
operates a running retryd through its HTTP API (retries, jobs, sources, policies,
analytics). Human tables by default, --json for scripts.

Exit codes: 0 ok, 1 the operation failed, 2 usage error.`,
		SilenceUsage:  true,
		SilenceErrors: true,
		Version:       version,
	}
	group(root)
	root.SetOut(stdout)
	root.SetErr(stderr)
	root.SetFlagErrorFunc(func(_ *cobra.Command, err error) error { return usageErr(err) })
	api := os.Getenv(envAPI)
	if api == "" {
		api = defaultAPI
	}
	pf := root.PersistentFlags()
	pf.StringVar(&g.api, "api", api, "retryd API base URL (env "+envAPI+")")
	pf.StringVar(&g.token, "token", os.Getenv(envToken), "API token, sent as Authorization: Bearer (env "+envToken+")")
	pf.StringVar(&g.caFile, "ca-file", os.Getenv(envCAFile), "PEM file of CAs to trust for an https --api, besides the system's (env "+envCAFile+")")
	config := os.Getenv(envConfig)
	if config == "" {
		config = defaultConfigPath()
	}
	pf.StringVar(&g.context, "context", "", "saved context to use (env "+envContext+"; default: the one of retryd context use)")
	pf.StringVar(&g.config, "config", config, "file of saved contexts (env "+envConfig+")")
	pf.BoolVar(&g.json, "json", false, "print JSON instead of tables")
	pf.DurationVar(&g.timeout, "timeout", defaultTimeout, "timeout of each API request")

	// A saved context fills in the API and token, except for the context
	// commands themselves, which save what the flags say.
	root.PersistentPreRunE = func(cmd *cobra.Command, _ []string) error {
		for c := cmd; c != nil; c = c.Parent() {
			if c.Name() == "context" && c.Parent() == root {
				return nil
			}
		}
		return g.applyContext(cmd)
	}
	root.AddCommand(
		newContextCmd(g),
		newDevCmd(g),
		newRetriesCmd(g),
		newJobsCmd(g),
		newSchedulesCmd(g),
		newRunsCmd(g),
		newSourcesCmd(g),
		newPoliciesCmd(g),
		newAnalyticsCmd(g),
		newSimulateCmd(g),
		newMigrateCmd(g),
		newMaintenanceCmd(g),
		newStreamsCmd(g),
		newShardsCmd(g),
		newGatewayCmd(g),
		newDevCertsCmd(g),
		newProbeCmd(g),
		newTokensCmd(g),
		newAuditCmd(g),
	)
	return root
}

// group makes cmd a command that only holds subcommands: without one it
// prints its help; with an unknown one it is a usage error.
func group(cmd *cobra.Command) *cobra.Command {
	cmd.Args = cobra.ArbitraryArgs
	cmd.RunE = func(cmd *cobra.Command, args []string) error {
		if len(args) == 0 {
			return cmd.Help()
		}
		msg := fmt.Sprintf("unknown command %q for %q", args[0], cmd.CommandPath())
		if cmd.SuggestionsMinimumDistance <= 0 {
			cmd.SuggestionsMinimumDistance = 2
		}
		if s := cmd.SuggestionsFor(args[0]); len(s) > 0 {
			msg += "; did you mean " + strings.Join(s, " or ") + "?"
		}
		return usageErrorf(cmd, "%s", msg)
	}
	return cmd
}

// usageError is a mistake in the command line: exit code 2.
type usageError struct {
	err  error
	path string // command path, for the --help hint
}

func (e *usageError) Error() string { return e.err.Error() }
func (e *usageError) Unwrap() error { return e.err }

func usageErr(err error) error { return &usageError{err: err} }

func usageErrorf(cmd *cobra.Command, format string, args ...any) error {
	return &usageError{err: fmt.Errorf(format, args...), path: cmd.CommandPath()}
}

// args returns a cobra.PositionalArgs that wants exactly the named
// arguments, at least min of them.
func args(min int, names ...string) cobra.PositionalArgs {
	return func(cmd *cobra.Command, a []string) error {
		if len(names) == 0 && len(a) > 0 {
			return usageErrorf(cmd, "%s takes no arguments, got %q", cmd.CommandPath(), a)
		}
		if len(a) < min || len(a) > len(names) {
			want := strings.Join(names, " ")
			if min < len(names) {
				want = strings.Join(names[:min], " ") + " [" + strings.Join(names[min:], " ") + "]"
			}
			return usageErrorf(cmd, "%s takes %s, got %d argument(s)", cmd.CommandPath(), strings.TrimSpace(want), len(a))
		}
		return nil
	}
}

// report prints err and returns the exit code.
func report(err error, stderr io.Writer) int {
	if err == nil {
		return exitOK
	}
	var ue *usageError
	if errors.As(err, &ue) {
		fmt.Fprintln(stderr, "Error:", err)
		if ue.path != "" {
			fmt.Fprintf(stderr, "Run '%s --help' for usage.\n", ue.path)
		}
		return exitUsage
	}
	fmt.Fprintln(stderr, "Error:", err)
	return exitFailed
}
