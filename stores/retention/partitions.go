package retention

import (
	"context"
	"fmt"
	"time"

	"github.com/jackc/pgx/v5"
)

// partition is one partition of a table and its range; lower is nil for
// MINVALUE (the table that 00109 or 00502 attached whole), both are nil for the
// DEFAULT partition.
type partition struct {
	name         string
	isDefault    bool
	lower, upper *time.Time
}

// partitions lists t's partitions. Postgres keeps a bound only as an
// expression (FOR VALUES FROM ('…') TO ('…')); the timestamps in it carry
// their offset, so casting them back is exact whatever the session's
// time zone.
func partitions(ctx context.Context, conn *pgx.Conn, t Table) ([]partition, error) {
	rows, err := conn.Query(ctx, `
SELECT c.relname::text, b.expr = 'DEFAULT',
       substring(b.expr FROM 'FROM \(''([^'']+)''\)')::timestamptz,
       substring(b.expr FROM 'TO \(''([^'']+)''\)')::timestamptz
FROM pg_inherits i
JOIN pg_class c ON c.oid = i.inhrelid
CROSS JOIN LATERAL (SELECT pg_get_expr(c.relpartbound, c.oid) AS expr) b
WHERE i.inhparent = $1::regclass
ORDER BY 1`, t.Name)
	if err != nil {
		return nil, fmt.Errorf("list partitions of %s: %w", t.Name, err)
	}
	out, err := pgx.CollectRows(rows, func(r pgx.CollectableRow) (partition, error) {
		var p partition
		err := r.Scan(&p.name, &p.isDefault, &p.lower, &p.upper)
		return p, err
	})
	if err != nil {
		return nil, fmt.Errorf("list partitions of %s: %w", t.Name, err)
	}
	return out, nil
}

// partName is the partition of t for the range (day or week) starting at
// d, named by its first UTC day.
func partName(t Table, d time.Time) string {
	return t.Name + "_p" + d.UTC().Format("20060102")
}

// maintain brings t to its retention as of now: the partitions of the
// range holding now to now+Ahead exist, none ends before the cutoff, and DEFAULT holds no row
// older than it. It reads the partitions once: another run, the only
// other thing that changes them, waits for the advisory lock.
func maintain(ctx context.Context, conn *pgx.Conn, t Table, now time.Time, opts Options, tr *TableReport) error {
	parts, err := partitions(ctx, conn, t)
	if err != nil {
		return err
	}
	var def string
	for _, p := range parts {
		if p.isDefault {
			def = p.name
		}
	}
	first := now.Truncate(t.Span) // UTC: time.Truncate counts from the zero time, a UTC Monday midnight
	for d := first; !d.After(now.Add(opts.Ahead)); d = d.Add(t.Span) {
		if covered(parts, d, d.Add(t.Span)) {
			continue
		}
		moved, err := createPart(ctx, conn, t, def, d, opts.DryRun)
		if err != nil {
			return err
		}
		tr.Created = append(tr.Created, partName(t, d))
		tr.MovedFromDefault += moved
	}
	for _, p := range parts {
		if p.isDefault || p.upper == nil || p.upper.After(tr.Cutoff) {
			continue
		}
		if err := change(ctx, conn, opts.DryRun, `DROP TABLE `+pgx.Identifier{p.name}.Sanitize()); err != nil {
			return fmt.Errorf("drop partition %s of %s: %w", p.name, t.Name, err)
		}
		tr.Dropped = append(tr.Dropped, p.name)
	}
	if def == "" {
		return nil
	}
	n, err := deleteRows(ctx, conn, opts.DryRun, def, t.Column+` < $1`, tr.Cutoff)
	if err != nil {
		return fmt.Errorf("delete old rows of partition %s: %w", def, err)
	}
	tr.DeletedFromDefault = n
	return nil
}

// covered says whether a partition other than DEFAULT overlaps [from, to).
func covered(parts []partition, from, to time.Time) bool {
	for _, p := range parts {
		if p.isDefault {
			continue
		}
		if (p.lower == nil || p.lower.Before(to)) && (p.upper == nil || p.upper.After(from)) {
			return true
		}
	}
	return false
}

// createPart creates t's partition of the range starting at d as a table
// of its own, moves into it the rows of that range that landed in the DEFAULT partition
// (Postgres refuses a new partition while DEFAULT holds rows of its
// range), then attaches it, all in one transaction. ATTACH takes a weaker
// lock on the parent than CREATE TABLE … PARTITION OF, so inserts go on.
func createPart(ctx context.Context, conn *pgx.Conn, t Table, def string, d time.Time, dry bool) (int64, error) {
	name := partName(t, d)
	from, to := d.Format(time.RFC3339), d.Add(t.Span).Format(time.RFC3339)
	var moved int64
	err := inTx(ctx, conn, func(tx pgx.Tx) error {
		id, parent := pgx.Identifier{name}.Sanitize(), pgx.Identifier{t.Name}.Sanitize()
		inRange := t.Column + ` >= $1 AND ` + t.Column + ` < $2`
		if def != "" {
			sel := `SELECT count(*) FROM ` + pgx.Identifier{def}.Sanitize() + ` WHERE ` + inRange
			if err := tx.QueryRow(ctx, sel, from, to).Scan(&moved); err != nil {
				return fmt.Errorf("count rows of its range in %s: %w", def, err)
			}
		}
		if dry {
			return nil
		}
		if _, err := tx.Exec(ctx, `CREATE TABLE `+id+` (LIKE `+parent+` INCLUDING DEFAULTS INCLUDING CONSTRAINTS)`); err != nil {
			return err
		}
		if moved > 0 {
			move := `WITH moved AS (DELETE FROM ` + pgx.Identifier{def}.Sanitize() + ` WHERE ` + inRange + ` RETURNING *)
INSERT INTO ` + id + ` SELECT * FROM moved`
			if _, err := tx.Exec(ctx, move, from, to); err != nil {
				return fmt.Errorf("move rows from %s: %w", def, err)
			}
		}
		_, err := tx.Exec(ctx, fmt.Sprintf(`ALTER TABLE %s ATTACH PARTITION %s FOR VALUES FROM ('%s') TO ('%s')`, parent, id, from, to))
		return err
	})
	if err != nil {
		return 0, fmt.Errorf("create partition %s of %s: %w", name, t.Name, err)
	}
	return moved, nil
}

// change runs one DDL statement in its own transaction, or nothing when
// dry.
func change(ctx context.Context, conn *pgx.Conn, dry bool, stmt string) error {
	if dry {
		return nil
	}
	return inTx(ctx, conn, func(tx pgx.Tx) error {
		_, err := tx.Exec(ctx, stmt)
		return err
	})
}

// deleteRows deletes the rows of partition that match where and counts
// them; dry, it counts the rows it would delete.
func deleteRows(ctx context.Context, conn *pgx.Conn, dry bool, partition, where string, args ...any) (int64, error) {
	from := pgx.Identifier{partition}.Sanitize() + ` WHERE ` + where
	var n int64
	err := inTx(ctx, conn, func(tx pgx.Tx) error {
		if dry {
			return tx.QueryRow(ctx, `SELECT count(*) FROM `+from, args...).Scan(&n)
		}
		tag, err := tx.Exec(ctx, `DELETE FROM `+from, args...)
		n = tag.RowsAffected()
		return err
	})
	return n, err
}

// inTx runs fn in a transaction whose waits for locks are bounded by
// lockTimeout.
func inTx(ctx context.Context, conn *pgx.Conn, fn func(pgx.Tx) error) error {
	return pgx.BeginFunc(ctx, conn, func(tx pgx.Tx) error {
		if _, err := tx.Exec(ctx, `SET LOCAL lock_timeout = '`+lockTimeout+`'`); err != nil {
			return fmt.Errorf("set lock timeout: %w", err)
		}
		return fn(tx)
	})
}
