// Package audit records who did which operator or admin action, in the
// audit_log table (migration 00501), and lists those records.
//
// The principal comes from the request's context (serve.PrincipalFrom),
// put there by serve.Guard from the token: never from a body, where a
// caller could claim to be anyone. Each service records its own actions
// with Record, in the transaction of the action, so an action that fails
// or rolls back leaves no row.
package audit

import (
	"context"
	"encoding/base64"
	"encoding/json"
	"fmt"
	"strconv"
	"strings"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgconn"
	"go.opentelemetry.io/otel/trace"

	"github.com/retryd/retryd/internal/pgquery"
	"github.com/retryd/retryd/internal/pgrows"
	"github.com/retryd/retryd/internal/serve"
	"github.com/retryd/retryd/stores/pgdb"
)

// Actions recorded; the target names what they act on.
const (
	RetryCancel     = "retry.cancel"     // retry/<kind>/<id>
	RetryRetry      = "retry.retry"      // retry/<kind>/<id>
	JobCancel       = "job.cancel"       // job/<id>
	JobRetry        = "job.retry"        // job/<id>
	JobBulkRetry    = "job.bulk_retry"   // operation/<id>
	OperationCancel = "operation.cancel" // operation/<id>
	PolicyPut       = "policy.put"       // policy/<kind>/<job_type>
	SourcePause     = "source.pause"     // source/<source>
	SourceResume    = "source.resume"    // source/<source>
	SourceSettings  = "source.settings"  // source/<source>
	EventCancel     = "event.cancel"     // event/<id>
	TriggerCreate   = "trigger.create"   // trigger/<id>
	TriggerUpdate   = "trigger.update"   // trigger/<id>
	TriggerDelete   = "trigger.delete"   // trigger/<id>
	TriggerEnable   = "trigger.enable"   // trigger/<id>
	TriggerDisable  = "trigger.disable"  // trigger/<id>
	TokenCreate     = "token.create"     // token/<id>
	TokenRevoke     = "token.revoke"     // token/<id>
	SchedulePut     = "schedule.put"     // schedule/<job_type>/<name>
	ScheduleDelete  = "schedule.delete"  // schedule/<job_type>/<name>
)

// maxDetailValue caps each string of a detail, so a long reason cannot
// bloat the log (the action's own record keeps it whole).
const maxDetailValue = 256

// Detail is an entry's small facts: a reason, an until, a version. Never
// a payload or a token.
type Detail map[string]any

// Execer is a transaction (or a pool, for an action that has none).
type Execer interface {
	Exec(ctx context.Context, sql string, args ...any) (pgconn.CommandTag, error)
}

// Querier reads the log: a pool, a connection or a transaction.
type Querier = pgrows.Querier

type nameKey struct{}

// Named returns ctx asking the action recorded under it to be named
// action instead of its default: the jobs API cancels and retries jobs
// through the scheduler's retry actions, and records them as job.cancel
// and job.retry.
func Named(ctx context.Context, action string) context.Context {
	return context.WithValue(ctx, nameKey{}, action)
}

// ActionName is the action a caller asked for with Named, or def.
func ActionName(ctx context.Context, def string) string {
	if a, ok := ctx.Value(nameKey{}).(string); ok && a != "" {
		return a
	}
	return def
}

// Record writes an entry for action on target by the principal of ctx,
// through db (the action's transaction). Without a principal in ctx the
// action was not asked for over the API (a bulk retry's runner retrying
// its items, an internal caller) and nothing is recorded: the request
// that started it was.
func Record(ctx context.Context, db Execer, action, target string, detail Detail) error {
	p, ok := serve.PrincipalFrom(ctx)
	if !ok {
		return nil
	}
	for k, v := range detail {
		switch s := v.(type) {
		case string:
			if len(s) > maxDetailValue {
				detail[k] = strings.ToValidUTF8(s[:maxDetailValue], "") + "…"
			}
		case nil:
			delete(detail, k)
		}
	}
	if detail == nil {
		detail = Detail{}
	}
	b, err := json.Marshal(detail)
	if err != nil {
		return fmt.Errorf("record audit %s: encode detail: %w", action, err)
	}
	var reqID *string
	// The trace id ties the entry to the request's spans and logs, when
	// tracing is on; there is no other request id.
	if sc := trace.SpanContextFromContext(ctx); sc.HasTraceID() {
		s := sc.TraceID().String()
		reqID = &s
	}
	if _, err := db.Exec(ctx, `INSERT INTO audit_log (principal, role, action, target, detail, request_id)
		VALUES ($1, $2, $3, $4, $5, $6)`, p.Name, p.Role.String(), action, target, string(b), reqID); err != nil {
		return fmt.Errorf("record audit %s: %w", action, err)
	}
	return nil
}

// Entry is one row of the log.
type Entry struct {
	ID        int64           `json:"id"`
	At        time.Time       `json:"at"`
	Principal string          `json:"principal"`
	Role      string          `json:"role"`
	Action    string          `json:"action"`
	Target    string          `json:"target"`
	Detail    json.RawMessage `json:"detail"`
	RequestID string          `json:"request_id,omitempty"`
}

// MaxLimit caps a page.
const MaxLimit = 500

// Filter selects entries; zero fields select all.
type Filter struct {
	Principal string
	Action    string
	Since     time.Time
	// Limit is the page size, 1 to MaxLimit (0 means 100).
	Limit int
	// Cursor is the NextCursor of the previous page, or empty.
	Cursor string
}

// Page is one page of List, newest first.
type Page struct {
	Entries []Entry `json:"entries"`
	// NextCursor is empty on the last page.
	NextCursor string `json:"next_cursor,omitempty"`
}

// List returns the entries matching f, newest first, one page at a time
// (keyset pagination on id: entries written meanwhile do not shift later
// pages).
func List(ctx context.Context, q Querier, f Filter) (Page, error) {
	limit, err := pgquery.Limit(f.Limit, MaxLimit)
	if err != nil {
		return Page{}, fmt.Errorf("list audit: %w", err)
	}
	var w pgquery.Where
	w.Equal("principal", f.Principal)
	w.Equal("action", f.Action)
	if !f.Since.IsZero() {
		w.Add("at >= ?", f.Since)
	}
	if f.Cursor != "" {
		raw, err := base64.RawURLEncoding.DecodeString(f.Cursor)
		if err != nil {
			return Page{}, pgdb.ErrBadCursor
		}
		id, err := strconv.ParseInt(string(raw), 10, 64)
		if err != nil || id < 1 {
			return Page{}, pgdb.ErrBadCursor
		}
		w.Add("id < ?", id)
	}
	sql := `SELECT id, at, principal, role, action, target, detail, coalesce(request_id, '') FROM audit_log` +
		w.SQL() + " ORDER BY id DESC LIMIT " + w.Arg(limit+1)
	var page Page
	page.Entries, page.NextCursor, err = pgrows.Page(ctx, q, "list audit", scanEntry, limit, func(e Entry) string {
		return base64.RawURLEncoding.EncodeToString([]byte(strconv.FormatInt(e.ID, 10)))
	}, sql, w.Args...)
	return page, err
}

func scanEntry(r pgx.Row) (Entry, error) {
	var e Entry
	var detail []byte
	err := r.Scan(&e.ID, &e.At, &e.Principal, &e.Role, &e.Action, &e.Target, &detail, &e.RequestID)
	e.Detail = detail
	return e, err
}
