// Package retention keeps the tables that grow with traffic to their
// retention. The append-only ones (retry_history, audit_log) are
// range-partitioned by time: it creates their partitions ahead of time and
// drops those whose whole range is older than the retention, which costs a
// catalog change instead of deleting and vacuuming each row. The item
// tables whose rows change state (retries, jobs) cannot be partitioned by
// time (a row would move between partitions as it changes, and the primary
// key must hold the partition key), so it deletes their terminal rows
// older than the retention in bounded batches instead, and with them the
// rows of their child tables (event_ingress_retries, workflow_run_steps)
// by ON DELETE CASCADE. An item table's retention must be at least the max
// age of the stream whose replays its rows refuse (Floor).
//
// It changes the schema (CREATE, ATTACH, DROP), so it runs as the tables'
// owner: `retryd maintenance`, from a Kubernetes CronJob or the dev
// runner, never a service, whose role may not run DDL
// (migrations.Grants).
package retention

import (
	"context"
	"fmt"
	"math"
	"slices"
	"strconv"
	"strings"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/rs/zerolog"

	"github.com/retryd/retryd/internal/streams"
	"github.com/retryd/retryd/pkg/contract"
)

// Defaults of Options.
const (
	DefaultHistoryRetention = 30 * 24 * time.Hour
	// DefaultAuditRetention is a year: the audit trail is small (operator
	// actions, not traffic) and is read long after the fact.
	DefaultAuditRetention = 365 * 24 * time.Hour
	// DefaultItemRetention is how long a retries or jobs row is kept after
	// its terminal state. Not shorter than the RETRIES stream's max age:
	// a fact still in the stream, redelivered or replayed into the
	// projection, would otherwise bring a deleted item back.
	DefaultItemRetention = streams.DefaultRetriesMaxAge
	DefaultAhead         = 7 * 24 * time.Hour
	// DefaultBatch bounds the rows one delete removes from an item table.
	DefaultBatch = 5000
)

// Partition ranges: UTC days, or UTC weeks from Monday (time.Truncate
// counts from the zero time, a Monday midnight UTC).
const (
	day  = 24 * time.Hour
	week = 7 * day
)

// lockKey is the advisory lock two maintenance runs take in turn, so two
// CronJob pods (or a CronJob and the dev runner) never create or drop the
// same partition at once; the second finds nothing left to do.
const lockKey int64 = 0x7265_7465_6e74 // "retent"

// lockTimeout bounds how long one partition change waits for its lock on
// the parent table: a DROP needs it exclusively, and while it waits every
// insert queues behind it. Giving up fails this run; the next one retries.
const lockTimeout = "5s"

// Table is one table retention keeps: either range partitioned by Column
// in ranges of Span (created by a migration with a DEFAULT partition), or
// an item table whose rows matching Terminal are deleted once Column is
// older than the retention.
type Table struct {
	Name, Column string
	// Span is the range of one partition (a day, or a week for a table
	// that gets few rows); zero for an item table.
	Span time.Duration
	// Terminal is the SQL condition of a row no fact changes any more
	// (item tables only).
	Terminal string
	// Guard is a further SQL condition a row must meet to be deleted,
	// one the partial index cannot hold (a subquery); "" is none.
	Guard string
	// Default is the retention unless Options.Keep names the table.
	Default time.Duration
	// Protects is the stream whose redelivered or replayed messages
	// this table's rows refuse or absorb (item tables only): its
	// retention must be at least that stream's max age (Floor).
	Protects string
	// Cascades names the tables whose rows go with a deleted row (ON
	// DELETE CASCADE), for messages.
	Cascades []string
}

// Tables are the tables a run keeps, in the order it keeps them.
var Tables = []Table{
	{Name: "retry_history", Column: "at", Span: day, Default: DefaultHistoryRetention},
	// Weekly: operator actions are few, and daily partitions of a year's
	// retention would be 365 tables of a few rows each.
	{Name: "audit_log", Column: "at", Span: week, Default: DefaultAuditRetention},
	// The conditions match the partial indexes of migrations 00110,
	// 00405, 00205 and 00305 word for word, so the planner uses them.
	// The jobs projection applies the facts of RETRIES too.
	{Name: "retries", Column: "resolved_at", Terminal: "state IN ('succeeded', 'exhausted', 'cancelled')",
		Default: DefaultItemRetention, Protects: contract.StreamRetries},
	{Name: "jobs", Column: "updated_at", Terminal: "status IN ('completed', 'failed', 'failed_max_retries', 'cancelled')",
		Default: DefaultItemRetention, Protects: contract.StreamRetries},
	// The gate stores an event id once: its row is what refuses an
	// INGEST message of that id redelivered or replayed after its inbox
	// claim was pruned. A deferred event is not terminal.
	{Name: "workflow_events", Column: "updated_at", Terminal: "status IN ('admitted', 'cancelled', 'exhausted')",
		Default: DefaultItemRetention, Protects: contract.StreamIngest, Cascades: []string{"event_ingress_retries"}},
	// A delivery's id (event, trigger) is what refuses an EVENTS message
	// delivered again; throttled and concurrency-limited deliveries are
	// held, not terminal. A launched delivery stays while its run is in
	// flight: the run's lease and retry passes read it.
	{Name: "workflow_trigger_deliveries", Column: "updated_at",
		Terminal: "status IN ('launched', 'filtered', 'cancelled', 'exhausted')",
		Guard: `NOT EXISTS (SELECT 1 FROM workflow_runs r WHERE r.run_id = workflow_trigger_deliveries.run_id
	AND r.status IN ('requested', 'in_progress', 'retrying'))`,
		Default: DefaultItemRetention, Protects: contract.StreamEvents},
	// A run's facts on RUNS (steps, completed, failed) for a run without
	// a row are ignored, never applied: the row keeps them applying.
	{Name: "workflow_runs", Column: "updated_at", Terminal: "status IN ('completed', 'failed', 'failed_max_retries')",
		Default: DefaultItemRetention, Protects: contract.StreamRuns, Cascades: []string{"workflow_run_steps"}},
}

// TableNames are the names of Tables, for messages.
func TableNames() []string {
	out := make([]string, len(Tables))
	for i, t := range Tables {
		out[i] = t.Name
	}
	return out
}

// Floor is the shortest retention t may have when its protected stream
// keeps messages for maxAge: a row deleted while a message about it can
// still be redelivered or replayed would let that message act again (an
// event admitted twice, a run launched twice, an item brought back). Zero
// for a table that protects no stream.
func Floor(t Table, maxAge map[string]time.Duration) time.Duration {
	if t.Protects == "" {
		return 0
	}
	return maxAge[t.Protects]
}

// Options says what to keep and how far ahead to create partitions.
type Options struct {
	// Keep overrides the retention of tables by name (Tables holds each
	// one's default).
	Keep map[string]time.Duration
	// Ahead is how far past today partitions are created.
	Ahead time.Duration
	// Batch bounds the rows one delete removes from an item table (0 is
	// DefaultBatch).
	Batch int
	// DryRun reports what a run would change and changes nothing.
	DryRun bool
	// Now is the clock; nil is time.Now.
	Now func() time.Time
	// MaxAge are the streams' max ages the caller checked the item
	// tables' retentions against (Floor), for the report; Run does not
	// check them (`retryd maintenance` does, and says what it read).
	MaxAge map[string]time.Duration
}

func (o Options) validate() error {
	if o.Ahead < 0 {
		return fmt.Errorf("Options.Ahead %s is negative", o.Ahead)
	}
	if o.Batch < 0 {
		return fmt.Errorf("Options.Batch %d is negative", o.Batch)
	}
	names := TableNames()
	for name, keep := range o.Keep {
		if !slices.Contains(names, name) {
			return fmt.Errorf("Options.Keep: %q is not a table retention keeps (%s)", name, strings.Join(names, ", "))
		}
		if keep <= 0 {
			return fmt.Errorf("Options.Keep: retention of %s %s is not positive", name, keep)
		}
	}
	return nil
}

// keep is t's retention under o.
func (o Options) keep(t Table) time.Duration {
	if d, ok := o.Keep[t.Name]; ok {
		return d
	}
	return t.Default
}

// Report is what a run did (or, dry, would do), per table.
type Report struct {
	DryRun bool          `json:"dry_run"`
	Tables []TableReport `json:"tables"`
	// Streams are the max ages the item tables' retentions were checked
	// against (Floor), as the caller read them; Run leaves it empty.
	Streams []StreamAge `json:"streams"`
}

// StreamAge is one stream's max age and where it was read.
type StreamAge struct {
	Stream string `json:"stream"`
	// MaxAge is as FormatDuration writes it, or "unlimited".
	MaxAge string `json:"max_age"`
	// From is "nats" (the stream's configuration on the server), "env"
	// (its RETRYD_STREAM_<NAME>_MAX_AGE) or "default" (neither).
	From string `json:"from"`
	// Tables are the item tables whose retention it floors.
	Tables []string `json:"tables"`
}

// Methods of TableReport.
const (
	MethodPartitions = "drop_partitions"
	MethodRows       = "delete_terminal_rows"
)

// TableReport is what a run did to one table.
type TableReport struct {
	Table string `json:"table"`
	// Method is how the table is kept: MethodPartitions or MethodRows.
	Method string `json:"method"`
	// Retention is how long the table keeps a row; rows older than
	// Cutoff (by their column, for an item table its terminal rows) are
	// gone once the run is done (the analytics cover Cutoff onwards).
	Retention string    `json:"retention"`
	Cutoff    time.Time `json:"cutoff"`
	// Created and Dropped name the partitions created and dropped.
	Created []string `json:"created"`
	Dropped []string `json:"dropped"`
	// MovedFromDefault counts rows moved from the DEFAULT partition into
	// a partition created for their range; DeletedFromDefault the rows
	// deleted from it for being older than the retention.
	MovedFromDefault   int64 `json:"moved_from_default"`
	DeletedFromDefault int64 `json:"deleted_from_default"`
	// Deleted counts the terminal rows deleted from an item table (not
	// counting the rows of Cascades that went with them).
	Deleted int64 `json:"deleted"`
	// Protects is the stream whose replays the item table refuses or
	// absorbs, and Floor its max age: the shortest retention allowed.
	Protects string `json:"protects,omitempty"`
	Floor    string `json:"floor,omitempty"`
}

// Run creates the partitions of the next Ahead, drops those older than
// the retention and deletes old rows from the DEFAULT partition, one
// transaction per change, then deletes the item tables' terminal rows
// older than their retention in batches of a transaction each, holding an
// advisory lock for the whole run. It may run any number of times; what
// is already done is skipped. On an error the report holds what was done
// before it.
func Run(ctx context.Context, conn *pgx.Conn, opts Options, log zerolog.Logger) (Report, error) {
	if opts.Now == nil {
		opts.Now = time.Now
	}
	if opts.Batch == 0 {
		opts.Batch = DefaultBatch
	}
	rep := Report{DryRun: opts.DryRun, Tables: []TableReport{}}
	if err := opts.validate(); err != nil {
		return rep, fmt.Errorf("run retention: %w", err)
	}
	if _, err := conn.Exec(ctx, `SELECT pg_advisory_lock($1)`, lockKey); err != nil {
		return rep, fmt.Errorf("take maintenance lock: %w", err)
	}
	defer func() {
		_, _ = conn.Exec(context.WithoutCancel(ctx), `SELECT pg_advisory_unlock($1)`, lockKey)
	}()
	for _, t := range Tables {
		keep := opts.keep(t)
		// Read after the lock: a run that held it may have changed them.
		now := opts.Now().UTC()
		tr := TableReport{Table: t.Name, Method: MethodPartitions, Retention: FormatDuration(keep), Cutoff: now.Add(-keep),
			Created: []string{}, Dropped: []string{}}
		var err error
		if t.Span == 0 {
			tr.Method = MethodRows
			err = prune(ctx, conn, t, opts, &tr, log)
			log.Info().Str("table", t.Name).Int64("deleted", tr.Deleted).Time("cutoff", tr.Cutoff).
				Bool("dry_run", opts.DryRun).Msg("retention")
		} else {
			err = maintain(ctx, conn, t, now, opts, &tr)
			log.Info().Str("table", t.Name).Strs("created", tr.Created).Strs("dropped", tr.Dropped).
				Int64("moved_from_default", tr.MovedFromDefault).Int64("deleted_from_default", tr.DeletedFromDefault).
				Bool("dry_run", opts.DryRun).Msg("retention")
		}
		if err == nil && !opts.DryRun {
			err = mark(ctx, conn, t.Name, tr.Cutoff)
		}
		tr.Protects = t.Protects
		if f := Floor(t, opts.MaxAge); f > 0 {
			tr.Floor = FormatDuration(f)
		}
		rep.Tables = append(rep.Tables, tr)
		if err != nil {
			return rep, err
		}
	}
	return rep, nil
}

// ParseDuration reads a retention: a number of days ("30d") or a Go
// duration ("36h").
func ParseDuration(s string) (time.Duration, error) {
	if n, ok := strings.CutSuffix(s, "d"); ok {
		days, err := strconv.Atoi(n)
		if err != nil || days < 0 {
			return 0, fmt.Errorf("parse duration %q: want a number of days such as 30d, or a duration such as 36h", s)
		}
		return time.Duration(days) * day, nil
	}
	d, err := time.ParseDuration(s)
	if err != nil {
		return 0, fmt.Errorf("parse duration %q: want a number of days such as 30d, or a duration such as 36h", s)
	}
	return d, nil
}

// Unlimited is the max age of a stream that keeps its messages until
// deleted (max_age 0 on the server): no retention is long enough.
const Unlimited = time.Duration(math.MaxInt64)

// FormatDuration writes d as ParseDuration reads it, in days when whole;
// Unlimited is "unlimited".
func FormatDuration(d time.Duration) string {
	if d == Unlimited {
		return "unlimited"
	}
	if d > 0 && d%day == 0 {
		return strconv.FormatInt(int64(d/day), 10) + "d"
	}
	return d.String()
}

// mark records that rows of table older than cutoff may be gone
// (retention_marks): the analytics say from when they are complete.
func mark(ctx context.Context, conn *pgx.Conn, table string, cutoff time.Time) error {
	_, err := conn.Exec(ctx, `INSERT INTO retention_marks (table_name, cutoff, ran_at) VALUES ($1, $2, now())
ON CONFLICT (table_name) DO UPDATE SET cutoff = greatest(retention_marks.cutoff, EXCLUDED.cutoff), ran_at = now()`, table, cutoff)
	if err != nil {
		return fmt.Errorf("record the retention of %s: %w", table, err)
	}
	return nil
}
