package main

import (
	"context"
	"errors"
	"fmt"
	"path/filepath"
	"strconv"
	"time"

	"github.com/nats-io/nats.go"
	"github.com/nats-io/nats.go/jetstream"
	"github.com/rs/zerolog"
	"github.com/spf13/cobra"

	"github.com/retryd/retryd/internal/envvar"
	"github.com/retryd/retryd/internal/natsconn"
	"github.com/retryd/retryd/internal/streams"
	"github.com/retryd/retryd/pkg/contract"
)

func newStreamsCmd(g *globals) *cobra.Command {
	cmd := group(&cobra.Command{
		Use:     "streams",
		Aliases: []string{"stream"},
		Short:   "retryd's JetStream streams: export, create, inspect, view",
		Long: `retryd's six streams: INGEST, EVENTS, RETRIES, RUNS, SCHEDULES and JOBS. ensure,
list and view connect to NATS with the NATS_* environment variables (NATS_URL,
NATS_CREDS, NATS_TLS_CA, ...; see docs/operations.md) or --nats-url.
export and ensure take each stream's limits from RETRYD_STREAM_<NAME>_MAX_BYTES
(e.g. 8GiB; -1 is no limit) and RETRYD_STREAM_<NAME>_MAX_AGE (e.g. 720h).`,
	})
	cmd.AddCommand(newStreamsExportCmd(g), newStreamsEnsureCmd(g), newStreamsListCmd(g), newStreamsViewCmd(g))
	return cmd
}

func newStreamsExportCmd(g *globals) *cobra.Command {
	var dir string
	var replicas int
	cmd := &cobra.Command{
		Use:   "export",
		Short: "Write one JSON file per stream for `nats stream add --config FILE`",
		Example: `  retryd streams export --dir ./streams
  retryd streams export --dir ./streams-r3 --replicas 3
  nats stream add --config ./streams/RETRIES.json`,
		Args: args(0),
		RunE: func(cmd *cobra.Command, _ []string) error {
			if dir == "" {
				return usageErrorf(cmd, "--dir is required")
			}
			opts, err := replicasOptions(cmd, replicas)
			if err != nil {
				return err
			}
			if err := streams.Export(dir, opts); err != nil {
				return err
			}
			var files []string
			for _, name := range streams.Names {
				files = append(files, filepath.Join(dir, name+".json"))
			}
			if g.json {
				return writeJSON(g.stdout, map[string]any{"dir": dir, "files": files})
			}
			for _, f := range files {
				fmt.Fprintln(g.stdout, "wrote", f)
			}
			fmt.Fprintf(g.stdout, "Create them with: for f in %s/*.json; do nats stream add --config \"$f\"; done\n", dir)
			return nil
		},
	}
	cmd.Flags().StringVar(&dir, "dir", "", "directory to write to (created if missing)")
	cmd.Flags().IntVar(&replicas, "replicas", 1, "replicas per stream (3 in a three-node cluster)")
	return cmd
}

// natsFlags connect the streams commands.
type natsFlags struct{ url string }

func (nf *natsFlags) register(cmd *cobra.Command) {
	cmd.Flags().StringVar(&nf.url, "nats-url", "", "NATS server URL (default $NATS_URL or "+natsconn.DefaultURL+")")
}

func (nf *natsFlags) connect(ctx context.Context, g *globals) (*nats.Conn, jetstream.JetStream, error) {
	opts := natsconn.OptionsFromEnv("retryd-cli")
	if nf.url != "" {
		opts.URL = nf.url
	}
	// Connect waits for an unreachable server until ctx ends: bound it.
	ctx, cancel := context.WithTimeout(ctx, min(g.timeout, 10*time.Second))
	defer cancel()
	nc, js, err := natsconn.Connect(ctx, opts, zerolog.Nop())
	if err != nil {
		return nil, nil, err
	}
	return nc, js, nil
}

// run connects to NATS and runs fn with a context bounded by --timeout;
// the connection is closed after. A request the server refuses (the
// `operator` user running `streams ensure`, say) fails at once with the
// server's permissions violation, not as a timeout.
func (nf *natsFlags) run(cmd *cobra.Command, g *globals, fn func(ctx context.Context, js jetstream.JetStream) error) error {
	nc, js, err := nf.connect(cmd.Context(), g)
	if err != nil {
		return err
	}
	defer nc.Close()
	ctx, stop := natsconn.WithRefusals(cmd.Context(), nc)
	defer stop()
	ctx, cancel := context.WithTimeout(ctx, g.timeout)
	defer cancel()
	return natsconn.Refused(ctx, fn(ctx, js))
}

// replicasOptions are the stream options of --replicas, a usage error
// when out of range, with the limits of the RETRYD_STREAM_* variables.
func replicasOptions(cmd *cobra.Command, replicas int) (streams.Options, error) {
	var e envvar.Reader
	opts := streams.OptionsFromEnv(&e)
	if err := e.Err(); err != nil {
		return opts, err
	}
	opts.Replicas = replicas
	if err := opts.Validate(); err != nil {
		return opts, usageErrorf(cmd, "--replicas: %v", err)
	}
	return opts, nil
}

func newStreamsEnsureCmd(g *globals) *cobra.Command {
	var nf natsFlags
	var replicas int
	cmd := &cobra.Command{
		Use:   "ensure",
		Short: "Create the streams, or update them to retryd's configuration",
		Args:  args(0),
		RunE: func(cmd *cobra.Command, _ []string) error {
			opts, err := replicasOptions(cmd, replicas)
			if err != nil {
				return err
			}
			return nf.run(cmd, g, func(ctx context.Context, js jetstream.JetStream) error {
				if err := streams.Ensure(ctx, js, opts); err != nil {
					return err
				}
				return printStreams(ctx, g, js)
			})
		},
	}
	nf.register(cmd)
	cmd.Flags().IntVar(&replicas, "replicas", 1, "replicas per stream (3 in a three-node cluster)")
	return cmd
}

func newStreamsListCmd(g *globals) *cobra.Command {
	var nf natsFlags
	cmd := &cobra.Command{
		Use:   "list",
		Short: "Show retryd's streams: messages, size, consumers",
		Args:  args(0),
		RunE: func(cmd *cobra.Command, _ []string) error {
			return nf.run(cmd, g, func(ctx context.Context, js jetstream.JetStream) error {
				return printStreams(ctx, g, js)
			})
		},
	}
	nf.register(cmd)
	return cmd
}

type streamRow struct {
	Name      string   `json:"name"`
	Subjects  []string `json:"subjects"`
	Exists    bool     `json:"exists"`
	Messages  uint64   `json:"messages"`
	Bytes     uint64   `json:"bytes"`
	Consumers int      `json:"consumers"`
	Replicas  int      `json:"replicas"`
	// Shards is how many scheduler shards RETRIES is split into
	// (docs/shards.md); 0 for the other streams.
	Shards int `json:"shards,omitempty"`
}

func printStreams(ctx context.Context, g *globals, js jetstream.JetStream) error {
	var rows []streamRow
	for _, name := range streams.Names {
		s, err := js.Stream(ctx, name)
		if errors.Is(err, jetstream.ErrStreamNotFound) {
			cfg, _ := streams.Config(name, streams.Options{})
			rows = append(rows, streamRow{Name: name, Subjects: cfg.Subjects})
			continue
		}
		if err != nil {
			return fmt.Errorf("read stream %s: %w", name, err)
		}
		info := s.CachedInfo()
		row := streamRow{Name: name, Subjects: info.Config.Subjects, Exists: true, Messages: info.State.Msgs,
			Bytes: info.State.Bytes, Consumers: info.State.Consumers, Replicas: info.Config.Replicas}
		if name == contract.StreamRetries {
			row.Shards, _ = streams.StreamShards(info.Config)
		}
		rows = append(rows, row)
	}
	if g.json {
		return writeJSON(g.stdout, rows)
	}
	t := newTable(g.stdout, "STREAM", "SUBJECTS", "MESSAGES", "BYTES", "CONSUMERS", "REPLICAS")
	missing := 0
	for _, r := range rows {
		if !r.Exists {
			missing++
			t.row(r.Name, joinOr(r.Subjects, ""), "missing", "", "", "")
			continue
		}
		t.row(r.Name, joinOr(r.Subjects, ""), strconv.FormatUint(r.Messages, 10), strconv.FormatUint(r.Bytes, 10),
			strconv.Itoa(r.Consumers), strconv.Itoa(r.Replicas))
	}
	if err := t.flush(); err != nil {
		return err
	}
	for _, r := range rows {
		if r.Shards > 1 {
			fmt.Fprintf(g.stdout, "%s is split into %d scheduler shards (docs/shards.md).\n", r.Name, r.Shards)
		}
	}
	if missing > 0 {
		fmt.Fprintf(g.stdout, "%d stream(s) missing: run retryd streams ensure.\n", missing)
	}
	return nil
}
