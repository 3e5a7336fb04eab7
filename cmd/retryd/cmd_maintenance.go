package main

import (
	"context"
	"fmt"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/spf13/cobra"

	"github.com/retryd/retryd/projections/retention"
)

func newMaintenanceCmd(g *globals) *cobra.Command {
	var dbURL, history, ahead string
	var dry bool
	cmd := &cobra.Command{
		Use:   "maintenance",
		Short: "Keep partitioned tables to their retention (owner's DATABASE_URL); safe to run any number of times",
		Long: `maintenance creates the daily partitions of retry_history ahead of time,
drops the partitions whose whole day is older than the retention (a catalog
change, no row-by-row delete), and deletes the rows older than the
retention that landed in the DEFAULT partition because no partition of
their day existed (rows of a day it creates are moved into it). Each change
is its own transaction; an advisory lock makes a second run at the same
time wait and then find nothing to do.

It changes the schema, so it runs as the tables' owner, like migrate: the
services' roles may not. Run it hourly (the Helm chart's maintenance
CronJob does; retryd dev runs it at start and hourly).`,
		Example: `  DATABASE_URL=postgres://retryd_owner@db/retryd retryd maintenance
  retryd maintenance --history-retention 90d --ahead 14d --dry-run`,
		Args: args(0),
		RunE: func(cmd *cobra.Command, _ []string) error {
			url, err := ownerDatabaseURL(cmd, dbURL)
			if err != nil {
				return err
			}
			opts := retention.Options{DryRun: dry}
			if opts.History, err = retention.ParseDuration(history); err != nil || opts.History <= 0 {
				return usageErrorf(cmd, "--history-retention: want a positive number of days such as 30d, got %q", history)
			}
			if opts.Ahead, err = retention.ParseDuration(ahead); err != nil || opts.Ahead < 0 {
				return usageErrorf(cmd, "--ahead: want a number of days such as 7d, got %q", ahead)
			}
			rep, err := runMaintenance(cmd.Context(), url, opts, g)
			if err != nil {
				return err
			}
			if g.json {
				return writeJSON(g.stdout, rep)
			}
			return writeMaintenance(g, rep)
		},
	}
	cmd.Flags().StringVar(&dbURL, "database-url", "", "Postgres URL of the tables' owner (default $DATABASE_URL)")
	cmd.Flags().StringVar(&history, "history-retention", retention.FormatDuration(retention.DefaultHistoryRetention),
		"how long retry_history keeps a row: days (30d) or a duration (36h)")
	cmd.Flags().StringVar(&ahead, "ahead", retention.FormatDuration(retention.DefaultAhead), "how far past today to create partitions")
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
	for _, tr := range rep.Tables {
		fmt.Fprintf(g.stdout, "%s keeps rows from %s: %d partition(s) %s, %d %s; DEFAULT partition: %d row(s) moved out, %d old row(s) deleted.\n",
			tr.Table, tr.Cutoff.Format(time.RFC3339), len(tr.Created), created, len(tr.Dropped), dropped,
			tr.MovedFromDefault, tr.DeletedFromDefault)
	}
	if rep.DryRun {
		fmt.Fprintln(g.stdout, "Dry run: nothing changed.")
	}
	return nil
}
