package main

import (
	"context"
	"fmt"
	"slices"
	"strings"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/spf13/cobra"

	"github.com/retryd/retryd/internal/streams"
	"github.com/retryd/retryd/stores/retention"
)

func newMaintenanceCmd(g *globals) *cobra.Command {
	var dbURL, natsURL, history, ahead string
	var keep []string
	var batch int
	var dry bool
	cmd := &cobra.Command{
		Use:   "maintenance",
		Short: "Keep the tables that grow with traffic to their retention (owner's DATABASE_URL); safe to run any number of times",
		Long: `maintenance keeps the tables that grow with traffic to their retention.

The append-only ones are partitioned by time: retry_history by UTC day
(30d), audit_log by UTC week (365d). maintenance creates their partitions
ahead of time, drops the partitions whose whole range is older than the
retention (a catalog change, no row-by-row delete), and deletes the rows
older than the retention that landed in the DEFAULT partition because no
partition of their range existed (rows of a range it creates are moved
into it).

The item tables, whose rows change state, are not partitioned: they lose
their terminal rows older than the retention after that state (30d), in
batches of --batch rows, each its own transaction: retries (succeeded,
exhausted, cancelled) and jobs (completed, failed, failed_max_retries,
cancelled); workflow_events (admitted, cancelled, exhausted; with their
event_ingress_retries row); workflow_trigger_deliveries (launched,
filtered, cancelled, exhausted; a launched one not while its run is in
flight); workflow_runs (completed, failed, failed_max_retries; with
their workflow_run_steps).

An item table's rows refuse or absorb the messages of one stream
redelivered or replayed: retries and jobs RETRIES, workflow_events
INGEST, workflow_trigger_deliveries EVENTS, workflow_runs RUNS. Its
retention may not be shorter than that stream's max age: a shorter
--retention is refused, a shorter default is raised to it. The max ages
are read from NATS when --nats-url or NATS_URL is set and the server
answers, otherwise from RETRYD_STREAM_<NAME>_MAX_AGE or the defaults (the
output says which).

Each change is its own transaction; an advisory lock makes a second run
at the same time wait and then find nothing to do.

It changes the schema, so it runs as the tables' owner, like migrate: the
services' roles may not. Run it hourly (the Helm chart's maintenance
CronJob does; retryd dev runs it at start and hourly).`,
		Example: `  DATABASE_URL=postgres://retryd_owner@db/retryd retryd maintenance
  retryd maintenance --retention retry_history=90d --retention audit_log=730d --ahead 14d --dry-run
  NATS_URL=nats://nats:4222 retryd maintenance --retention workflow_events=60d`,
		Args: args(0),
		RunE: func(cmd *cobra.Command, _ []string) error {
			url, err := ownerDatabaseURL(cmd, dbURL)
			if err != nil {
				return err
			}
			opts := retention.Options{DryRun: dry, Batch: batch, Keep: map[string]time.Duration{}}
			given := map[string]bool{}
			for _, kv := range keep {
				name, dur, ok := strings.Cut(kv, "=")
				if !ok || !slices.Contains(retention.TableNames(), name) {
					return usageErrorf(cmd, "--retention: want table=duration with a table of %s, got %q",
						strings.Join(retention.TableNames(), ", "), kv)
				}
				d, err := retention.ParseDuration(dur)
				if err != nil || d <= 0 {
					return usageErrorf(cmd, "--retention: want a positive number of days such as 30d for %s, got %q", name, dur)
				}
				if _, dup := opts.Keep[name]; dup {
					return usageErrorf(cmd, "--retention: %s given twice", name)
				}
				opts.Keep[name], given[name] = d, true
			}
			if cmd.Flags().Changed("history-retention") {
				if _, dup := opts.Keep["retry_history"]; dup {
					return usageErrorf(cmd, "--history-retention: retry_history's retention is also given by --retention")
				}
				d, err := retention.ParseDuration(history)
				if err != nil || d <= 0 {
					return usageErrorf(cmd, "--history-retention: want a positive number of days such as 30d, got %q", history)
				}
				opts.Keep["retry_history"] = d
			}
			if opts.Ahead, err = retention.ParseDuration(ahead); err != nil || opts.Ahead < 0 {
				return usageErrorf(cmd, "--ahead: want a number of days such as 7d, got %q", ahead)
			}
			if batch < 1 {
				return usageErrorf(cmd, "--batch: want a positive number of rows, got %d", batch)
			}
			ages, err := readStreamAges(cmd.Context(), cmd, g, natsURL)
			if err != nil {
				return err
			}
			if err := applyFloors(cmd, &opts, ages, given); err != nil {
				return err
			}
			if ages.note != "" {
				log := g.progressLog()
				log.Warn().Msg(ages.note)
			}
			rep, err := runMaintenance(cmd.Context(), url, opts, g)
			rep.Streams = reportStreams(ages)
			if err != nil {
				return err
			}
			if g.json {
				return writeJSON(g.stdout, rep)
			}
			return writeMaintenance(g, rep)
		},
	}
	defaults := make([]string, len(retention.Tables))
	for i, t := range retention.Tables {
		defaults[i] = t.Name + "=" + retention.FormatDuration(t.Default)
	}
	cmd.Flags().StringVar(&dbURL, "database-url", "", "Postgres URL of the tables' owner (default $DATABASE_URL)")
	cmd.Flags().StringVar(&natsURL, "nats-url", "",
		"NATS server to read the streams' max ages from (default $NATS_URL; neither: RETRYD_STREAM_<NAME>_MAX_AGE or the defaults)")
	cmd.Flags().StringArrayVar(&keep, "retention", nil,
		"a table's retention as table=duration, days (30d) or a duration (36h); repeat per table (defaults "+strings.Join(defaults, ", ")+")")
	cmd.Flags().StringVar(&history, "history-retention", retention.FormatDuration(retention.DefaultHistoryRetention),
		"how long retry_history keeps a row (the same as --retention retry_history=…)")
	cmd.Flags().StringVar(&ahead, "ahead", retention.FormatDuration(retention.DefaultAhead), "how far past today to create partitions")
	cmd.Flags().IntVar(&batch, "batch", retention.DefaultBatch, "rows one delete removes from an item table, one transaction each")
	cmd.Flags().BoolVar(&dry, "dry-run", false, "report what would change, change nothing")
	return cmd
}

// runMaintenance runs retention once on its own connection.
func runMaintenance(ctx context.Context, url string, opts retention.Options, g *globals) (retention.Report, error) {
	conn, err := pgx.Connect(ctx, url)
	if err != nil {
		return retention.Report{}, fmt.Errorf("maintenance: connect: %w", err)
	}
	defer conn.Close(context.WithoutCancel(ctx))
	rep, err := retention.Run(ctx, conn, opts, g.progressLog())
	if err != nil {
		return rep, fmt.Errorf("maintenance: %w", err)
	}
	return rep, nil
}

func writeMaintenance(g *globals, rep retention.Report) error {
	created, dropped := "created", "dropped"
	if rep.DryRun {
		created, dropped = "would create", "would drop"
	}
	t := newTable(g.stdout, "TABLE", "RETENTION", "CHANGE", "PARTITION")
	for _, tr := range rep.Tables {
		for _, p := range tr.Created {
			t.row(tr.Table, tr.Retention, created, p)
		}
		for _, p := range tr.Dropped {
			t.row(tr.Table, tr.Retention, dropped, p)
		}
	}
	if err := t.flush(); err != nil {
		return err
	}
	deleted := "deleted"
	if rep.DryRun {
		deleted = "would be deleted"
	}
	for _, s := range rep.Streams {
		from := map[string]string{ageFromNATS: "read from NATS", ageFromEnv: "from " + streams.EnvMaxAge(s.Stream),
			ageFromDefault: "default, " + streams.EnvMaxAge(s.Stream) + " unset"}[s.From]
		fmt.Fprintf(g.stdout, "%s max_age %s (%s): the floor of %s.\n", s.Stream, s.MaxAge, from, strings.Join(s.Tables, ", "))
	}
	for _, tr := range rep.Tables {
		if tr.Method == retention.MethodRows {
			fmt.Fprintf(g.stdout, "%s keeps terminal rows from %s (%s, at least %s's max_age %s): %d row(s) %s.\n",
				tr.Table, tr.Cutoff.Format(time.RFC3339), tr.Retention, tr.Protects, tr.Floor, tr.Deleted, deleted)
			continue
		}
		fmt.Fprintf(g.stdout, "%s keeps rows from %s: %d partition(s) %s, %d %s; DEFAULT partition: %d row(s) moved out, %d old row(s) deleted.\n",
			tr.Table, tr.Cutoff.Format(time.RFC3339), len(tr.Created), created, len(tr.Dropped), dropped,
			tr.MovedFromDefault, tr.DeletedFromDefault)
	}
	if rep.DryRun {
		fmt.Fprintln(g.stdout, "Dry run: nothing changed.")
	}
	return nil
}
