package migrations

import (
	"context"
	"fmt"
	"slices"
	"strings"

	"github.com/jackc/pgx/v5"
	"github.com/rs/zerolog"
)

// Roles names the Postgres roles of the services, as created by
// deploy/postgres/roles.sql. An empty name, or a role the server does not
// have, is skipped: a deployment that runs every service as one role
// (retryd_app, or the owner in development) needs no grants.
type Roles struct {
	// Scheduler is retryd-scheduler's role, which also hosts the jobs
	// projection and the jobs API (same process, same pool).
	Scheduler string
	// Ingress is retryd-ingress's role.
	Ingress string
	// Triggers is retryd-triggers's role.
	Triggers string
	// ReadOnly is the gateway's role: the dashboard counts retries.
	ReadOnly string
}

// DefaultRoles are the names deploy/postgres/roles.sql creates.
var DefaultRoles = Roles{Scheduler: "retryd_scheduler", Ingress: "retryd_ingress", Triggers: "retryd_triggers", ReadOnly: "retryd_readonly"}

// rw is what a service may do to the rows of a table it owns. Never
// TRUNCATE, REFERENCES or TRIGGER: those are schema-level powers.
const rw = "SELECT, INSERT, UPDATE, DELETE"

// tokenCheck is what checking a caller's token takes: read it, and set
// its last_used_at.
const tokenCheck = "SELECT, UPDATE"

// Grants lists, per service, the tables it reads or writes and the
// privileges it needs, derived from the SQL of its stores
// (services/*/internal/*store, stores/*, internal/outbox and internal/inbox). A migration that adds a
// table adds it here; TestGrantsCoverEveryTable fails until it does.
//
// inbox and outbox are shared: each service's rows carry its consumer or
// owner name, and nothing in Postgres stops one service from touching
// another's rows there (row-level security would; not done yet).
func (r Roles) Grants() map[string]map[string]string {
	g := map[string]map[string]string{}
	add := func(role string, privs string, tables ...string) {
		if role == "" {
			return
		}
		if g[role] == nil {
			g[role] = map[string]string{}
		}
		for _, t := range tables {
			g[role][t] = privs
		}
	}
	shared := []string{"inbox", "outbox"}
	// Retries, policies, holds' releases, and the jobs projection with its
	// bulk operations (services/jobs runs in retryd-scheduler).
	add(r.Scheduler, rw, shared...)
	add(r.Scheduler, rw, "retries", "retry_history", "retry_hold_releases", "retry_release_parts", "retry_policies", "retry_policy_versions",
		"jobs", "job_operations", "job_operation_items")
	// Events, sources and their gate, event deferrals.
	add(r.Ingress, rw, shared...)
	add(r.Ingress, rw, "workflow_events", "event_sources", "event_source_slots", "event_source_windows",
		"event_source_holds", "event_ingress_retries")
	// Triggers, their deliveries, runs.
	add(r.Triggers, rw, shared...)
	add(r.Triggers, rw, "workflow_triggers", "workflow_trigger_versions", "workflow_trigger_deliveries",
		"workflow_runs", "workflow_run_steps", "trigger_events")
	// The analytics' window: what retention removed before (written by
	// `retryd maintenance`, which runs as the owner).
	add(r.Scheduler, "SELECT", "retention_marks")
	// The dashboard's counts (scheduler.Summary).
	add(r.ReadOnly, "SELECT", "retries")
	// API tokens: the scheduler serves /v1/tokens and ensures the
	// bootstrap token; every service, and the gateway, checks tokens and
	// records when each was last used.
	add(r.Scheduler, rw, "api_tokens")
	add(r.Ingress, tokenCheck, "api_tokens")
	add(r.Triggers, tokenCheck, "api_tokens")
	add(r.ReadOnly, tokenCheck, "api_tokens")
	// The audit trail: each service records its own actions, in their
	// transactions; the scheduler also serves GET /v1/audit, and records
	// token changes and the jobs API's actions (it hosts both). Nobody
	// updates or deletes a row.
	add(r.Scheduler, "SELECT, INSERT", "audit_log")
	add(r.Ingress, "INSERT", "audit_log")
	add(r.Triggers, "INSERT", "audit_log")
	return g
}

// Grant gives each role of r that exists exactly the privileges of
// r.Grants() on the tables of schema public: it first revokes whatever
// the role had on them, so a table a service no longer uses is taken
// away on the next run. Run it as the tables' owner (or a superuser)
// after Up; `retryd migrate` does. It runs in one transaction and may run
// any number of times.
func Grant(ctx context.Context, databaseURL string, r Roles, log zerolog.Logger) error {
	conn, err := pgx.Connect(ctx, databaseURL)
	if err != nil {
		return fmt.Errorf("grant: connect: %w", err)
	}
	defer conn.Close(context.WithoutCancel(ctx))
	tx, err := conn.Begin(ctx)
	if err != nil {
		return fmt.Errorf("grant: begin: %w", err)
	}
	defer tx.Rollback(context.WithoutCancel(ctx)) //nolint:errcheck // after Commit, a no-op
	grants := r.Grants()
	roles := make([]string, 0, len(grants))
	for role := range grants {
		roles = append(roles, role)
	}
	slices.Sort(roles)
	for _, role := range roles {
		var exists bool
		if err := tx.QueryRow(ctx, `SELECT EXISTS (SELECT 1 FROM pg_roles WHERE rolname = $1)`, role).Scan(&exists); err != nil {
			return fmt.Errorf("grant: look up role %s: %w", role, err)
		}
		if !exists {
			log.Debug().Str("role", role).Msg("no such role, no grants")
			continue
		}
		id := pgx.Identifier{role}.Sanitize()
		if _, err := tx.Exec(ctx, `REVOKE ALL ON ALL TABLES IN SCHEMA public FROM `+id); err != nil {
			return fmt.Errorf("grant: revoke from %s: %w", role, err)
		}
		tables := make([]string, 0, len(grants[role]))
		for t := range grants[role] {
			tables = append(tables, t)
		}
		slices.Sort(tables)
		for _, t := range tables {
			stmt := fmt.Sprintf(`GRANT %s ON TABLE %s TO %s`, grants[role][t], pgx.Identifier{"public", t}.Sanitize(), id)
			if _, err := tx.Exec(ctx, stmt); err != nil {
				return fmt.Errorf("grant: %s: %w", stmt, err)
			}
		}
		log.Info().Str("role", role).Str("tables", strings.Join(tables, ",")).Msg("granted")
	}
	if err := tx.Commit(ctx); err != nil {
		return fmt.Errorf("grant: commit: %w", err)
	}
	return nil
}
