package main

import (
	"context"
	"errors"
	"net/url"
	"os"
	"os/exec"
	"path/filepath"
	"testing"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgconn"
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

// TestRolesSQL runs deploy/postgres/roles.sql with psql, migrates as the
// owner and checks that the runtime role reads and writes rows but has no
// DDL.
func TestRolesSQL(t *testing.T) {
	t.Parallel()
	psql := psqlPath()
	if psql == "" {
		if os.Getenv("CI") == "true" {
			t.Fatal("psql not found: CI installs postgresql-15")
		}
		t.Skip("psql not found")
	}
	admin := pgtest.NewEmptyDatabaseURL(t)
	suffix := contract.NewID()[18:] // unique names on a shared server
	owner, app, db := "retryd_owner_t"+suffix, "retryd_app_t"+suffix, "retryd_t"+suffix
	ctx, cancel := context.WithTimeout(context.Background(), 2*time.Minute)
	t.Cleanup(cancel)

	out, err := exec.CommandContext(ctx, psql, "--no-psqlrc", "-X", "-q", "-d", admin,
		"-v", "owner="+owner, "-v", "app="+app, "-v", "db="+db,
		"-v", "owner_password=owner-pw", "-v", "app_password=app-pw",
		"-f", filepath.Join(deployDir, "postgres", "roles.sql")).CombinedOutput()
	require.NoError(t, err, "psql: %s", out)
	t.Cleanup(func() {
		conn, err := pgx.Connect(context.Background(), admin)
		if err != nil {
			return
		}
		defer conn.Close(context.Background())
		for _, stmt := range []string{
			`DROP DATABASE IF EXISTS ` + pgx.Identifier{db}.Sanitize() + ` WITH (FORCE)`,
			`DROP ROLE IF EXISTS ` + pgx.Identifier{app}.Sanitize(),
			`DROP ROLE IF EXISTS ` + pgx.Identifier{owner}.Sanitize(),
		} {
			_, _ = conn.Exec(context.Background(), stmt)
		}
	})

	as := func(role, password string) string {
		u, err := url.Parse(admin)
		require.NoError(t, err)
		u.User = url.UserPassword(role, password)
		u.Path = "/" + db
		return u.String()
	}
	require.NoError(t, migrations.Up(ctx, as(owner, "owner-pw"), zerolog.Nop()), "the owner applies the schema")

	conn, err := pgx.Connect(ctx, as(app, "app-pw"))
	require.NoError(t, err)
	t.Cleanup(func() { conn.Close(context.Background()) })
	// Rows: read, insert (with an identity column), update, delete.
	var n int
	require.NoError(t, conn.QueryRow(ctx, `SELECT count(*) FROM retry_policies`).Scan(&n))
	require.Positive(t, n)
	_, err = conn.Exec(ctx, `INSERT INTO outbox (owner, subject, msg_id, payload) VALUES ('t', 's', 'm', '\x00')`)
	require.NoError(t, err, "insert with an identity column")
	_, err = conn.Exec(ctx, `UPDATE outbox SET attempts = 1 WHERE owner = 't'`)
	require.NoError(t, err)
	_, err = conn.Exec(ctx, `DELETE FROM outbox WHERE owner = 't'`)
	require.NoError(t, err)
	// No DDL.
	for _, stmt := range []string{
		`CREATE TABLE app_table (id int)`,
		`ALTER TABLE retries ADD COLUMN x int`,
		`DROP TABLE inbox`,
		`TRUNCATE retries`,
		`CREATE SCHEMA app_schema`,
	} {
		_, err := conn.Exec(ctx, stmt)
		var pgErr *pgconn.PgError
		require.True(t, errors.As(err, &pgErr), "%s: %v", stmt, err)
		require.Equal(t, "42501", pgErr.Code, "%s is refused for lack of privilege: %v", stmt, err)
	}
}
