package main

import (
	"fmt"
	"os"
	"strconv"

	"github.com/rs/zerolog"
	"github.com/spf13/cobra"

	"github.com/retryd/retryd/migrations"
)

func newMigrateCmd(g *globals) *cobra.Command {
	var dbURL string
	var statusOnly bool
	roles := migrations.DefaultRoles
	cmd := &cobra.Command{
		Use:   "migrate",
		Short: "Apply the Postgres schema (DATABASE_URL); safe to run any number of times",
		Long: `migrate applies every pending migration, each in its own transaction, under
an advisory lock (several processes may run it at once). Run it with the
migration owner role (see deploy/postgres/roles.sql); the services then
connect with their own roles. After the schema, it grants each service
role that exists (retryd_scheduler, retryd_ingress, retryd_triggers,
retryd_readonly) exactly the tables that service uses, and revokes the
rest; roles the server does not have are skipped.`,
		Example: `  DATABASE_URL=postgres://retryd_owner@db/retryd retryd migrate
  retryd migrate --status`,
		Args: args(0),
		RunE: func(cmd *cobra.Command, _ []string) error {
			dbURL, err := ownerDatabaseURL(cmd, dbURL)
			if err != nil {
				return err
			}
			log := g.progressLog()
			if !statusOnly {
				if err := migrations.Up(cmd.Context(), dbURL, log); err != nil {
					return fmt.Errorf("migrate: %w", err)
				}
				if err := migrations.Grant(cmd.Context(), dbURL, roles, log); err != nil {
					return fmt.Errorf("migrate: %w", err)
				}
			}
			status, err := migrations.Status(cmd.Context(), dbURL)
			if err != nil {
				return fmt.Errorf("migration status: %w", err)
			}
			if g.json {
				return writeJSON(g.stdout, status)
			}
			t := newTable(g.stdout, "VERSION", "MIGRATION", "APPLIED")
			pending := 0
			for _, s := range status {
				applied := "pending"
				if s.Applied {
					applied = s.AppliedAt.Local().Format("2006-01-02 15:04:05")
				} else {
					pending++
				}
				t.row(strconv.FormatInt(s.Version, 10), s.Name, applied)
			}
			if err := t.flush(); err != nil {
				return err
			}
			if pending > 0 {
				fmt.Fprintf(g.stdout, "%d migration(s) pending: run retryd migrate.\n", pending)
			} else {
				fmt.Fprintf(g.stdout, "Schema up to date (version %d).\n", migrations.Latest())
			}
			return nil
		},
	}
	cmd.Flags().StringVar(&dbURL, "database-url", "", "Postgres URL (default $DATABASE_URL)")
	cmd.Flags().BoolVar(&statusOnly, "status", false, "only show which migrations are applied")
	// Only for roles.sql run with other names (-v scheduler=...); empty
	// skips that role.
	cmd.Flags().StringVar(&roles.Scheduler, "scheduler-role", roles.Scheduler, "Postgres role of retryd-scheduler, granted its tables")
	cmd.Flags().StringVar(&roles.Ingress, "ingress-role", roles.Ingress, "Postgres role of retryd-ingress, granted its tables")
	cmd.Flags().StringVar(&roles.Triggers, "triggers-role", roles.Triggers, "Postgres role of retryd-triggers, granted its tables")
	cmd.Flags().StringVar(&roles.ReadOnly, "readonly-role", roles.ReadOnly, "Postgres role of the gateway, granted SELECT on retries")
	return cmd
}

// ownerDatabaseURL is flag, else $DATABASE_URL: the URL of the commands
// that change the schema (migrate, maintenance), which run as the owner.
func ownerDatabaseURL(cmd *cobra.Command, flag string) (string, error) {
	if flag == "" {
		flag = os.Getenv("DATABASE_URL")
	}
	if flag == "" {
		return "", usageErrorf(cmd, "set DATABASE_URL or --database-url")
	}
	return flag, nil
}

// progressLog logs a command's progress on stderr; with --json, nowhere,
// so that a script reads one JSON document.
func (g *globals) progressLog() zerolog.Logger {
	if g.json {
		return zerolog.Nop()
	}
	return zerolog.New(zerolog.ConsoleWriter{Out: g.stderr, NoColor: true}).With().Timestamp().Logger()
}
