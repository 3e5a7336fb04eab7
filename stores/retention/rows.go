package retention

import (
	"context"
	"fmt"

	"github.com/jackc/pgx/v5"
	"github.com/rs/zerolog"
)

// prune deletes t's terminal rows whose column is older than the cutoff,
// opts.Batch rows per transaction, logging each batch, until a batch
// finds fewer: a large backlog never holds long locks or one huge
// transaction, and a run cut short leaves only whole batches done, which
// the next run continues. Dry, it counts the rows it would delete.
//
// A row a fact changes meanwhile (an operator retrying an exhausted item)
// is not deleted: the DELETE picks rows by ctid, and under READ COMMITTED
// Postgres rechecks its conditions on the row's new version, whose ctid
// differs.
func prune(ctx context.Context, conn *pgx.Conn, t Table, opts Options, tr *TableReport, log zerolog.Logger) error {
	id := pgx.Identifier{t.Name}.Sanitize()
	old := t.Terminal + ` AND ` + t.Column + ` < $1`
	if t.Guard != "" {
		old += ` AND ` + t.Guard
	}
	if opts.DryRun {
		err := conn.QueryRow(ctx, `SELECT count(*) FROM `+id+` WHERE `+old, tr.Cutoff).Scan(&tr.Deleted)
		if err != nil {
			return fmt.Errorf("count terminal rows of %s: %w", t.Name, err)
		}
		return nil
	}
	del := `DELETE FROM ` + id + ` WHERE ctid = ANY(ARRAY(SELECT ctid FROM ` + id + ` WHERE ` + old + ` LIMIT $2)) AND ` + old
	for {
		var n int64
		err := inTx(ctx, conn, func(tx pgx.Tx) error {
			tag, err := tx.Exec(ctx, del, tr.Cutoff, opts.Batch)
			n = tag.RowsAffected()
			return err
		})
		if err != nil {
			return fmt.Errorf("delete terminal rows of %s: %w", t.Name, err)
		}
		tr.Deleted += n
		if n > 0 {
			log.Info().Str("table", t.Name).Int64("batch", n).Int64("deleted", tr.Deleted).Msg("retention deleted terminal rows")
		}
		if n < int64(opts.Batch) {
			return nil
		}
	}
}
