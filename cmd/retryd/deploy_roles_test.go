package main

import (
	"context"
	"errors"
	"github.com/retryd/retryd/internal/servicetest"
	"net/url"
	"os/exec"
	"path/filepath"
	"testing"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgconn"
	"github.com/jackc/pgx/v5/pgxpool"
	"github.com/rs/zerolog"
	"github.com/stretchr/testify/require"

	"github.com/retryd/retryd/migrations"
	"github.com/retryd/retryd/migrations/pgtest"
	"github.com/retryd/retryd/pkg/contract"
)

func psqlPath() string {
	if p, err := exec.LookPath("psql"); err == nil {
		return p
	}
	if m, _ := filepath.Glob("/usr/lib/postgresql/*/bin/psql"); len(m) > 0 {
		return m[len(m)-1]
	}
	return ""
}

// TestRolesSQL runs deploy/postgres/roles.sql with psql, migrates and
// grants as the owner (what `retryd migrate` does) and checks that each
// service role reads and writes its own rows, is refused another
// service's and has no DDL. migrations.TestGrant checks the grants table
// by table; this checks that roles.sql and the grants fit together.
func TestRolesSQL(t *testing.T) {
	t.Parallel()
	ctx, cancel := context.WithTimeout(context.Background(), 2*time.Minute)
	t.Cleanup(cancel)
	suffix := contract.NewID()[18:] // unique names on a shared server
	owner, db := "retryd_owner_t"+suffix, "retryd_t"+suffix
	roles := migrations.Roles{Scheduler: "retryd_scheduler_t" + suffix, Ingress: "retryd_ingress_t" + suffix,
		Triggers: "retryd_triggers_t" + suffix, ReadOnly: "retryd_readonly_t" + suffix}
	admin, as := runRolesSQL(ctx, t, db,
		[]string{roles.Scheduler, roles.Ingress, roles.Triggers, roles.ReadOnly, owner},
		"owner", owner, "owner_password", "owner-pw",
		"scheduler", roles.Scheduler, "scheduler_password", "scheduler-pw",
		"ingress", roles.Ingress, "ingress_password", "ingress-pw",
		"triggers", roles.Triggers, "triggers_password", "triggers-pw",
		"readonly", roles.ReadOnly, "readonly_password", "readonly-pw")

	ownerURL := as(owner, "owner-pw")
	require.NoError(t, migrations.Up(ctx, ownerURL, zerolog.Nop()), "the owner applies the schema")
	require.NoError(t, migrations.Grant(ctx, ownerURL, roles, zerolog.Nop()), "the owner grants its tables")

	var exists bool
	require.NoError(t, pgxQueryRow(ctx, t, admin, `SELECT EXISTS (SELECT 1 FROM pg_roles WHERE rolname = 'retryd_app_t`+suffix+`')`, &exists))
	require.False(t, exists, "no all-tables runtime role unless app_password is given")

	for _, tc := range []struct {
		role, password string
		allowed        []string
		denied         []string
	}{
		{roles.Scheduler, "scheduler-pw",
			[]string{`SELECT count(*) FROM retry_policies`,
				`INSERT INTO outbox (owner, subject, msg_id, payload) VALUES ('t', 's', 'm', '\x00')`,
				`UPDATE outbox SET attempts = 1 WHERE owner = 't'`,
				`DELETE FROM outbox WHERE owner = 't'`,
				// rebuild's session table
				`CREATE TEMP TABLE rebuild_probe (msg_id text PRIMARY KEY)`},
			[]string{`SELECT count(*) FROM workflow_events`, `SELECT count(*) FROM workflow_triggers`}},
		{roles.Ingress, "ingress-pw",
			[]string{`SELECT count(*) FROM event_sources`, `INSERT INTO inbox (consumer, msg_id) VALUES ('t', 'm')`},
			[]string{`UPDATE retries SET updated_at = now() WHERE false`, `SELECT count(*) FROM workflow_triggers`,
				`CREATE TEMP TABLE probe (x int)`}},
		{roles.Triggers, "triggers-pw",
			[]string{`SELECT count(*) FROM workflow_trigger_deliveries`},
			[]string{`UPDATE retries SET updated_at = now() WHERE false`, `SELECT count(*) FROM event_sources`}},
		{roles.ReadOnly, "readonly-pw",
			[]string{`SELECT count(*) FROM retries`},
			[]string{`INSERT INTO inbox (consumer, msg_id) VALUES ('r', 'm')`, `DELETE FROM retries WHERE false`}},
	} {
		conn, err := pgx.Connect(ctx, as(tc.role, tc.password))
		require.NoError(t, err, tc.role)
		for _, stmt := range tc.allowed {
			_, err := conn.Exec(ctx, stmt)
			require.NoError(t, err, "%s may: %s", tc.role, stmt)
		}
		// No DDL for anyone, and no other service's tables.
		for _, stmt := range append(tc.denied,
			`CREATE TABLE app_table (id int)`,
			`ALTER TABLE retries ADD COLUMN x int`,
			`DROP TABLE inbox`,
			`TRUNCATE retries`,
			`CREATE SCHEMA app_schema`,
		) {
			_, err := conn.Exec(ctx, stmt)
			requireNoPrivilege(t, err, tc.role+": "+stmt)
		}
		require.NoError(t, conn.Close(ctx))
	}
}

// runRolesSQL runs deploy/postgres/roles.sql with psql as the superuser
// of a fresh server database, vars (name, value pairs) and db as its psql
// variables; at cleanup it drops the database db and then the roles in
// drop, in that order. It returns the superuser's URL and as, a URL to db
// as a role with its password. Without psql the test skips, except in
// CI, which installs it.
func runRolesSQL(ctx context.Context, t *testing.T, db string, drop []string, vars ...string) (admin string, as func(role, password string) string) {
	t.Helper()
	psql := psqlPath()
	servicetest.NeedTool(t, psql != "", "psql", "apt-get install postgresql-15")
	admin = pgtest.NewEmptyDatabaseURL(t)
	args := []string{"--no-psqlrc", "-X", "-q", "-d", admin, "-v", "db=" + db}
	for i := 0; i+1 < len(vars); i += 2 {
		args = append(args, "-v", vars[i]+"="+vars[i+1])
	}
	args = append(args, "-f", filepath.Join(deployDir, "postgres", "roles.sql"))
	out, err := exec.CommandContext(ctx, psql, args...).CombinedOutput()
	require.NoError(t, err, "psql: %s", out)
	t.Cleanup(func() {
		conn, err := pgx.Connect(context.Background(), admin)
		if err != nil {
			return
		}
		defer conn.Close(context.Background())
		_, _ = conn.Exec(context.Background(), `DROP DATABASE IF EXISTS `+pgx.Identifier{db}.Sanitize()+` WITH (FORCE)`)
		for _, role := range drop {
			_, _ = conn.Exec(context.Background(), `DROP ROLE IF EXISTS `+pgx.Identifier{role}.Sanitize())
		}
	})
	return admin, func(role, password string) string {
		u, err := url.Parse(admin)
		require.NoError(t, err)
		u.User = url.UserPassword(role, password)
		u.Path = "/" + db
		return u.String()
	}
}

// requireNoPrivilege checks that err is Postgres refusing what for lack
// of privilege (42501), not failing in some other way.
func requireNoPrivilege(t *testing.T, err error, what string) {
	t.Helper()
	var pgErr *pgconn.PgError
	require.True(t, errors.As(err, &pgErr), "%s: %v", what, err)
	require.Equal(t, "42501", pgErr.Code, "%s is refused for lack of privilege: %v", what, err)
}

func pgxQueryRow(ctx context.Context, t *testing.T, dbURL, query string, dest ...any) error {
	t.Helper()
	conn, err := pgx.Connect(ctx, dbURL)
	require.NoError(t, err)
	defer conn.Close(context.Background())
	return conn.QueryRow(ctx, query).Scan(dest...)
}

// TestRolesSQLLegacyApp runs roles.sql the way deployments from before
// the per-service roles did (owner and app passwords only; fault scenario
// 12 still does): retryd_app gets data rights on every table, the service
// roles are not created, and Grant skips them.
func TestRolesSQLLegacyApp(t *testing.T) {
	t.Parallel()
	ctx, cancel := context.WithTimeout(context.Background(), 2*time.Minute)
	t.Cleanup(cancel)
	suffix := contract.NewID()[18:]
	owner, app, db := "retryd_owner_l"+suffix, "retryd_app_l"+suffix, "retryd_l"+suffix
	scheduler := "retryd_scheduler_l" + suffix
	admin, as := runRolesSQL(ctx, t, db, []string{app, owner},
		"owner", owner, "app", app, "scheduler", scheduler,
		"owner_password", "owner-pw", "app_password", "app-pw")
	ownerURL := as(owner, "owner-pw")
	require.NoError(t, migrations.Up(ctx, ownerURL, zerolog.Nop()))
	require.NoError(t, migrations.Grant(ctx, ownerURL, migrations.Roles{Scheduler: scheduler}, zerolog.Nop()), "absent roles are skipped")
	var exists bool
	require.NoError(t, pgxQueryRow(ctx, t, admin, `SELECT EXISTS (SELECT 1 FROM pg_roles WHERE rolname = '`+scheduler+`')`, &exists))
	require.False(t, exists, "a service role is created only with its password")

	conn, err := pgx.Connect(ctx, as(app, "app-pw"))
	require.NoError(t, err)
	t.Cleanup(func() { conn.Close(context.Background()) })
	for _, stmt := range []string{
		`INSERT INTO inbox (consumer, msg_id) VALUES ('legacy', 'm')`,
		`UPDATE retries SET updated_at = now() WHERE false`,
		`SELECT count(*) FROM workflow_events`,
	} {
		_, err := conn.Exec(ctx, stmt)
		require.NoError(t, err, stmt)
	}
	_, err = conn.Exec(ctx, `CREATE TABLE legacy_probe (x int)`)
	requireNoPrivilege(t, err, "the app's DDL")
}

// TestMigrateGrantsServiceRoles runs `retryd migrate` with a service role
// of another name: after the schema it grants that role its tables, and
// the role reads them.
func TestMigrateGrantsServiceRoles(t *testing.T) {
	t.Parallel()
	dbURL := pgtest.NewEmptyDatabaseURL(t)
	ctx, cancel := context.WithTimeout(context.Background(), 2*time.Minute)
	t.Cleanup(cancel)
	role := "retryd_readonly_m" + contract.NewID()[18:]
	pgtest.CreateRoles(ctx, t, dbURL, role)

	r := cli(t, "migrate", "--database-url", dbURL, "--readonly-role", role,
		"--scheduler-role", "", "--ingress-role", "", "--triggers-role", "")
	require.Equal(t, exitOK, r.code, r.stderr)

	conn, err := pgx.Connect(ctx, pgtest.URLAs(t, dbURL, role))
	require.NoError(t, err)
	t.Cleanup(func() { _ = conn.Close(context.Background()) })
	var n int
	require.NoError(t, conn.QueryRow(ctx, `SELECT count(*) FROM retries`).Scan(&n), "granted by retryd migrate")
	_, err = conn.Exec(ctx, `DELETE FROM retries WHERE false`)
	requireNoPrivilege(t, err, "the read-only role's DELETE")
}

// rolePools are pools connected as the service roles.
type rolePools struct {
	scheduler, ingress, triggers, readOnly *pgxpool.Pool
}

// servicePools creates the four service roles (unique names: roles are
// per server and the test server is shared), grants them with
// migrations.Grant on the migrated database at dbURL, and opens a pool
// as each. Cleanup closes the pools and drops the roles.
func servicePools(ctx context.Context, t *testing.T, dbURL string) rolePools {
	t.Helper()
	roles := pgtest.ServiceRoles(ctx, t, dbURL)
	require.NoError(t, migrations.Grant(ctx, dbURL, roles, zerolog.Nop()))
	open := func(role string) *pgxpool.Pool {
		pool, err := pgxpool.New(ctx, pgtest.URLAs(t, dbURL, role))
		require.NoError(t, err)
		t.Cleanup(pool.Close)
		return pool
	}
	return rolePools{scheduler: open(roles.Scheduler), ingress: open(roles.Ingress), triggers: open(roles.Triggers), readOnly: open(roles.ReadOnly)}
}
