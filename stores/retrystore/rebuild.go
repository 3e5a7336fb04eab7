package retrystore

import (
	"context"
	"fmt"

	"github.com/jackc/pgx/v5"
)

// Undecided returns the rows a rebuild left awaiting a decision: a failure
// recorded (state scheduled) without a next attempt time, because the
// decision event was not in the stream.
func Undecided(ctx context.Context, q Querier) ([]Key, error) {
	rows, err := q.Query(ctx, `SELECT kind, item_id FROM retries
WHERE state = 'scheduled' AND next_attempt_at IS NULL ORDER BY kind, item_id`)
	if err != nil {
		return nil, fmt.Errorf("list undecided retries: %w", err)
	}
	var out []Key
	var k Key
	if _, err := pgx.ForEachRow(rows, []any{&k.Kind, &k.ItemID}, func() error {
		out = append(out, k)
		return nil
	}); err != nil {
		return nil, fmt.Errorf("list undecided retries: %w", err)
	}
	return out, nil
}

// SetFailedClass sets the error class of an item's latest failed history
// entry, when it differs: the class a decision was made with is the one
// the history must show.
func SetFailedClass(ctx context.Context, q Querier, kind, itemID, class string) error {
	_, err := q.Exec(ctx, `UPDATE retry_history SET error_class = $3
WHERE id = (SELECT max(id) FROM retry_history WHERE kind = $1 AND item_id = $2 AND event = 'failed')
	AND error_class <> $3`, kind, itemID, class)
	if err != nil {
		return fmt.Errorf("set failed class of %s/%s: %w", kind, itemID, err)
	}
	return nil
}

// Delete removes an item's row (not its history).
func Delete(ctx context.Context, q Querier, kind, itemID string) error {
	if _, err := q.Exec(ctx, `DELETE FROM retries WHERE kind = $1 AND item_id = $2`, kind, itemID); err != nil {
		return fmt.Errorf("delete retry %s/%s: %w", kind, itemID, err)
	}
	return nil
}

// DeleteHistory removes the history entries of an item recorded for one
// message id.
func DeleteHistory(ctx context.Context, q Querier, kind, itemID, msgID string) error {
	_, err := q.Exec(ctx, `DELETE FROM retry_history WHERE kind = $1 AND item_id = $2 AND msg_id = $3`, kind, itemID, msgID)
	if err != nil {
		return fmt.Errorf("delete history of %s/%s: %w", kind, itemID, err)
	}
	return nil
}
