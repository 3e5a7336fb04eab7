package migrations_test

import (
	"context"
	"errors"
	"slices"
	"testing"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgconn"
	"github.com/rs/zerolog"
	"github.com/stretchr/testify/require"

	"github.com/retryd/retryd/migrations"
	"github.com/retryd/retryd/migrations/pgtest"
)

// TestGrantsCoverEveryTable fails when a migration adds a table that no
// service role is granted (the service using it would get "permission
// denied" in a deployment with one role per service), or when Grants names
// a table that does not exist.
func TestGrantsCoverEveryTable(t *testing.T) {
	t.Parallel()
	conn := pgtest.NewConn(t)
	// Partitions are left out: a service reaches them through their
	// partitioned table, whose privileges Postgres checks instead.
	schema := pgtest.Strings(t, conn, `SELECT table_name::text FROM information_schema.tables
		WHERE table_schema = 'public' AND table_name <> 'goose_db_version'
		AND NOT (SELECT relispartition FROM pg_class WHERE oid = format('public.%I', table_name)::regclass)
		ORDER BY 1`)

	var granted []string
	for _, tables := range migrations.DefaultRoles.Grants() {
		for table := range tables {
			if !slices.Contains(granted, table) {
				granted = append(granted, table)
			}
		}
	}
	slices.Sort(granted)
	require.Equal(t, schema, granted, "every table is granted to the service that uses it (migrations.Roles.Grants)")
}

// TestGrant creates the four service roles on a migrated database, grants
// them with migrations.Grant (twice: it is idempotent) and checks, as each
// role, what it may do and what it is refused.
func TestGrant(t *testing.T) {
	t.Parallel()
	ctx, cancel := context.WithTimeout(context.Background(), 2*time.Minute)
	t.Cleanup(cancel)
	dbURL := pgtest.NewDatabaseURL(t)
	roles := pgtest.ServiceRoles(ctx, t, dbURL)
	require.NoError(t, migrations.Grant(ctx, dbURL, roles, zerolog.Nop()))
	require.NoError(t, migrations.Grant(ctx, dbURL, roles, zerolog.Nop()), "Grant runs again")
	// A role the server does not have is skipped, not an error.
	require.NoError(t, migrations.Grant(ctx, dbURL, migrations.Roles{Scheduler: roles.Scheduler + "_missing"}, zerolog.Nop()))

	as := func(role string) *pgx.Conn {
		conn, err := pgx.Connect(ctx, pgtest.URLAs(t, dbURL, role))
		require.NoError(t, err)
		t.Cleanup(func() { _ = conn.Close(context.Background()) })
		return conn
	}
	// Writes match no row (WHERE false): privileges are checked when the
	// statement is planned, so a refusal still shows.
	for _, tc := range []struct {
		role            string
		allowed, denied []string
	}{
		{
			role: roles.Scheduler,
			allowed: []string{
				`SELECT count(*) FROM retries`,
				`UPDATE retries SET updated_at = now() WHERE false`,
				`DELETE FROM retry_history WHERE false`,
				// Rows reach retry_history's partitions through it: the
				// partitions themselves are granted to nobody.
				`INSERT INTO retry_history (kind, item_id, attempt, event) VALUES ('job', 'grant-probe', 1, 'failed')`,
				`SELECT count(*) FROM retry_history WHERE item_id = 'grant-probe'`,
				`SELECT count(*) FROM retry_policies`,
				`INSERT INTO retry_hold_releases SELECT * FROM retry_hold_releases WHERE false`,
				`UPDATE jobs SET updated_at = now() WHERE false`,
				`INSERT INTO job_operations SELECT * FROM job_operations WHERE false`,
				`INSERT INTO outbox (owner, subject, msg_id, payload) VALUES ('t', 's', 'm', '\x00') ON CONFLICT DO NOTHING`,
				`DELETE FROM outbox WHERE owner = 't'`,
				`INSERT INTO inbox (consumer, msg_id) VALUES ('t', 'm') ON CONFLICT DO NOTHING`,
				`INSERT INTO audit_log (principal, role, action, target) SELECT 't', 'admin', 'probe', 't' WHERE false`,
				`SELECT count(*) FROM audit_log`,
			},
			denied: []string{
				// The audit trail is append-only for every service.
				`UPDATE audit_log SET target = '' WHERE false`,
				`DELETE FROM audit_log WHERE false`,
				`SELECT count(*) FROM workflow_events`,
				`UPDATE event_sources SET paused = true WHERE false`,
				`SELECT count(*) FROM workflow_trigger_deliveries`,
				`UPDATE workflow_runs SET status = 'failed' WHERE false`,
				`TRUNCATE retries`,
				`CREATE TABLE scheduler_probe (x int)`,
				`ALTER TABLE retries ADD COLUMN probe int`,
				// Retention is maintenance's, as the owner (retryd maintenance).
				`DROP TABLE retry_history_default`,
				`ALTER TABLE retry_history DETACH PARTITION retry_history_default`,
				`SELECT count(*) FROM retry_history_default`,
			},
		},
		{
			role: roles.Ingress,
			allowed: []string{
				`SELECT count(*) FROM workflow_events`,
				`UPDATE workflow_events SET updated_at = now() WHERE false`,
				`SELECT count(*) FROM event_sources`,
				`DELETE FROM event_source_holds WHERE false`,
				`INSERT INTO event_source_windows SELECT * FROM event_source_windows WHERE false`,
				`UPDATE event_ingress_retries SET updated_at = now() WHERE false`,
				`INSERT INTO outbox (owner, subject, msg_id, payload) VALUES ('t', 's', 'm', '\x00') ON CONFLICT DO NOTHING`,
				`INSERT INTO inbox (consumer, msg_id) VALUES ('t', 'm') ON CONFLICT DO NOTHING`,
				// A release refreshes the line's statistics through the
				// owner's function (ANALYZE needs the owner).
				`SELECT ingress_analyze_release_line()`,
				`INSERT INTO audit_log (principal, role, action, target) SELECT 't', 'admin', 'probe', 't' WHERE false`,
			},
			denied: []string{
				// Only the scheduler reads the audit trail (GET /v1/audit).
				`SELECT count(*) FROM audit_log`,
				`DELETE FROM audit_log WHERE false`,
				// Retries are the scheduler's: ingress asks for decisions
				// over NATS and never writes them.
				`UPDATE retries SET updated_at = now() WHERE false`,
				`SELECT count(*) FROM retries`,
				`UPDATE retry_policies SET max_retries = 0 WHERE false`,
				`INSERT INTO jobs SELECT * FROM jobs WHERE false`,
				`DELETE FROM workflow_triggers WHERE false`,
				`TRUNCATE workflow_events`,
				`CREATE TABLE ingress_probe (x int)`,
			},
		},
		{
			role: roles.Triggers,
			allowed: []string{
				`SELECT count(*) FROM workflow_triggers`,
				`INSERT INTO workflow_trigger_versions SELECT * FROM workflow_trigger_versions WHERE false`,
				`UPDATE workflow_trigger_deliveries SET updated_at = now() WHERE false`,
				`UPDATE workflow_runs SET updated_at = now() WHERE false`,
				`DELETE FROM trigger_events WHERE false`,
				`INSERT INTO outbox (owner, subject, msg_id, payload) VALUES ('t', 's', 'm', '\x00') ON CONFLICT DO NOTHING`,
				`INSERT INTO audit_log (principal, role, action, target) SELECT 't', 'admin', 'probe', 't' WHERE false`,
			},
			denied: []string{
				`SELECT count(*) FROM audit_log`,
				`UPDATE retries SET updated_at = now() WHERE false`,
				`UPDATE workflow_events SET updated_at = now() WHERE false`,
				`SELECT count(*) FROM event_sources`,
				`SELECT count(*) FROM retry_policies`,
				`TRUNCATE workflow_runs`,
				`CREATE TABLE triggers_probe (x int)`,
			},
		},
		{
			role:    roles.ReadOnly,
			allowed: []string{`SELECT kind, state, count(*) FROM retries GROUP BY kind, state`},
			denied: []string{
				`INSERT INTO retries SELECT * FROM retries WHERE false`,
				`UPDATE retries SET updated_at = now() WHERE false`,
				`DELETE FROM retries WHERE false`,
				`INSERT INTO inbox (consumer, msg_id) VALUES ('t', 'm') ON CONFLICT DO NOTHING`,
				`INSERT INTO outbox (owner, subject, msg_id, payload) VALUES ('t', 's', 'm', '\x00') ON CONFLICT DO NOTHING`,
				`SELECT count(*) FROM outbox`,
				`SELECT count(*) FROM workflow_events`,
				`SELECT count(*) FROM retry_history`,
				`SELECT count(*) FROM audit_log`,
				`CREATE TABLE readonly_probe (x int)`,
			},
		},
	} {
		conn := as(tc.role)
		for _, stmt := range tc.allowed {
			_, err := conn.Exec(ctx, stmt)
			require.NoError(t, err, "%s may: %s", tc.role, stmt)
		}
		for _, stmt := range tc.denied {
			_, err := conn.Exec(ctx, stmt)
			var pgErr *pgconn.PgError
			require.True(t, errors.As(err, &pgErr), "%s is refused %s, got %v", tc.role, stmt, err)
			require.Equal(t, "42501", pgErr.Code, "%s is refused %s for lack of privilege: %v", tc.role, stmt, err)
		}
	}
}
