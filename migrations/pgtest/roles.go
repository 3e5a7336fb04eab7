package pgtest

import (
	"context"
	"net/url"
	"testing"

	"github.com/jackc/pgx/v5"

	"github.com/retryd/retryd/migrations"
)

// ServiceRoles creates the four service roles of migrations.Roles with
// CreateRoles, named retryd_<service>_t<random>: roles are per server,
// and test binaries share the server.
func ServiceRoles(ctx context.Context, t testing.TB, dbURL string) migrations.Roles {
	t.Helper()
	suffix := "_t" + randomHex(4)
	roles := migrations.Roles{Scheduler: "retryd_scheduler" + suffix, Ingress: "retryd_ingress" + suffix,
		Triggers: "retryd_triggers" + suffix, ReadOnly: "retryd_readonly" + suffix}
	CreateRoles(ctx, t, dbURL, roles.Scheduler, roles.Ingress, roles.Triggers, roles.ReadOnly)
	return roles
}

// CreateRoles creates login roles, neither superuser nor allowed to create
// databases or roles, on the server of the database at dbURL (one of this
// package's). Its t.Cleanup runs before the database's drop: what each
// role owns or was granted in that database goes, then the role.
func CreateRoles(ctx context.Context, t testing.TB, dbURL string, names ...string) {
	t.Helper()
	admin, err := pgx.Connect(ctx, dbURL)
	if err != nil {
		t.Fatalf("pgtest: connect: %v", err)
	}
	t.Cleanup(func() {
		ctx := context.Background()
		defer admin.Close(ctx)
		for _, r := range names {
			_, _ = admin.Exec(ctx, `DROP OWNED BY `+ident(r))
			_, _ = admin.Exec(ctx, `DROP ROLE IF EXISTS `+ident(r))
		}
	})
	for _, r := range names {
		if _, err := admin.Exec(ctx, `CREATE ROLE `+ident(r)+` LOGIN NOSUPERUSER NOCREATEDB NOCREATEROLE`); err != nil {
			t.Fatalf("pgtest: create role %s: %v", r, err)
		}
	}
}

// URLAs is dbURL with role as its user and no password: the test server
// trusts local connections.
func URLAs(t testing.TB, dbURL, role string) string {
	t.Helper()
	u, err := url.Parse(dbURL)
	if err != nil {
		t.Fatalf("pgtest: parse database URL: %v", err)
	}
	u.User = url.User(role)
	return u.String()
}
