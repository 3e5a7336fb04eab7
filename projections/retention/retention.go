// Package retention keeps the tables that grow with traffic to their
// retention by whole partitions: it creates the daily partitions ahead of
// time and drops those whose whole day is older than the retention, which
// costs a catalog change instead of deleting and vacuuming each row.
//
// It changes the schema (CREATE, ATTACH, DROP), so it runs as the tables'
// owner: `retryd maintenance`, from a Kubernetes CronJob or the dev
// runner, never a service, whose role may not run DDL
// (migrations.Grants).
package retention

import (
	"context"
	"fmt"
	"strconv"
	"strings"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/rs/zerolog"
)

// Defaults of Options.
const (
	DefaultHistoryRetention = 30 * 24 * time.Hour
	DefaultAhead            = 7 * 24 * time.Hour
)

// day is a partition's range: partitions are UTC days.
const day = 24 * time.Hour

// lockKey is the advisory lock two maintenance runs take in turn, so two
// CronJob pods (or a CronJob and the dev runner) never create or drop the
// same partition at once; the second finds nothing left to do.
const lockKey int64 = 0x7265_7465_6e74 // "retent"

// lockTimeout bounds how long one partition change waits for its lock on
// the parent table: a DROP needs it exclusively, and while it waits every
// insert queues behind it. Giving up fails this run; the next one retries.
const lockTimeout = "5s"

// Options says what to keep and how far ahead to create partitions.
type Options struct {
	// History is how long retry_history keeps a row (by its at).
	History time.Duration
	// Ahead is how far past today partitions are created.
	Ahead time.Duration
	// DryRun reports what a run would change and changes nothing.
	DryRun bool
	// Now is the clock; nil is time.Now.
	Now func() time.Time
}

// Report is what a run did (or, dry, would do), per table.
type Report struct {
	DryRun bool          `json:"dry_run"`
	Tables []TableReport `json:"tables"`
}

// TableReport is what a run did to one partitioned table.
type TableReport struct {
	Table string `json:"table"`
	// Retention is how long the table keeps a row; rows older than
	// Cutoff are gone once their partition is (the table's analytics
	// cover Cutoff onwards).
	Retention string    `json:"retention"`
	Cutoff    time.Time `json:"cutoff"`
	// Created and Dropped name the partitions created and dropped.
	Created []string `json:"created"`
	Dropped []string `json:"dropped"`
	// MovedFromDefault counts rows moved from the DEFAULT partition into
	// a partition created for their day; DeletedFromDefault the rows
	// deleted from it for being older than the retention.
	MovedFromDefault   int64 `json:"moved_from_default"`
	DeletedFromDefault int64 `json:"deleted_from_default"`
}

// table is one partitioned table: range partitioned by column, in UTC
// days, created by a migration with a DEFAULT partition.
type table struct {
	name, column string
	keep         time.Duration
}

func (o Options) tables() []table {
	return []table{{name: "retry_history", column: "at", keep: o.History}}
}

// Run creates the partitions of the next Ahead, drops those older than
// the retention and deletes old rows from the DEFAULT partition, one
// transaction per change, holding an advisory lock for the whole run. It
// may run any number of times; what is already done is skipped. On an
// error the report holds what was done before it.
func Run(ctx context.Context, conn *pgx.Conn, opts Options, log zerolog.Logger) (Report, error) {
	if opts.Now == nil {
		opts.Now = time.Now
	}
	rep := Report{DryRun: opts.DryRun, Tables: []TableReport{}}
	if opts.Ahead < 0 {
		return rep, fmt.Errorf("run retention: ahead %s is negative", opts.Ahead)
	}
	if _, err := conn.Exec(ctx, `SELECT pg_advisory_lock($1)`, lockKey); err != nil {
		return rep, fmt.Errorf("take maintenance lock: %w", err)
	}
	defer func() {
		_, _ = conn.Exec(context.WithoutCancel(ctx), `SELECT pg_advisory_unlock($1)`, lockKey)
	}()
	for _, t := range opts.tables() {
		if t.keep <= 0 {
			return rep, fmt.Errorf("run retention of %s: retention %s is not positive", t.name, t.keep)
		}
		// Read after the lock: a run that held it may have changed them.
		now := opts.Now().UTC()
		tr := TableReport{Table: t.name, Retention: FormatDuration(t.keep), Cutoff: now.Add(-t.keep),
			Created: []string{}, Dropped: []string{}}
		err := maintain(ctx, conn, t, now, opts, &tr)
		rep.Tables = append(rep.Tables, tr)
		log.Info().Str("table", t.name).Strs("created", tr.Created).Strs("dropped", tr.Dropped).
			Int64("moved_from_default", tr.MovedFromDefault).Int64("deleted_from_default", tr.DeletedFromDefault).
			Bool("dry_run", opts.DryRun).Msg("retention")
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

// FormatDuration writes d as ParseDuration reads it, in days when whole.
func FormatDuration(d time.Duration) string {
	if d > 0 && d%day == 0 {
		return strconv.FormatInt(int64(d/day), 10) + "d"
	}
	return d.String()
}
