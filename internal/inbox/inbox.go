// Package inbox records which messages a consumer has applied, so a
// redelivered or republished message changes nothing.
//
// A consumer that changes Postgres claims the message in the same
// transaction as the change:
//
//	first, err := inbox.Claim(ctx, tx, "scheduler", msg.Headers().Get(contract.HeaderMsgID))
//	if err != nil { return err }        // roll back, nak: try again later
//	if !first { return tx.Commit(ctx) } // duplicate: change nothing, ack
//	... apply the message ...
//	return tx.Commit(ctx)               // then ack
//
// If the transaction rolls back, so does the claim, and the redelivery is
// applied. Two deliveries of one message handled at the same time are
// serialised by the primary key: the second Claim waits for the first
// transaction and returns false if it committed.
package inbox

import (
	"context"
	"errors"
	"fmt"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgxpool"
)

// ErrEmptyKey is returned by Claim for an empty consumer or message id: a
// message without a Nats-Msg-Id cannot be deduplicated.
var ErrEmptyKey = errors.New("inbox claim needs a consumer and a message id")

// Claim records that consumer applies msgID in tx. It returns true the
// first time (apply the message) and false when the message was already
// applied (a duplicate: change nothing).
func Claim(ctx context.Context, tx pgx.Tx, consumer, msgID string) (bool, error) {
	if consumer == "" || msgID == "" {
		return false, fmt.Errorf("%w (consumer %q, msg id %q)", ErrEmptyKey, consumer, msgID)
	}
	tag, err := tx.Exec(ctx,
		"INSERT INTO inbox (consumer, msg_id) VALUES ($1, $2) ON CONFLICT DO NOTHING", consumer, msgID)
	if err != nil {
		return false, fmt.Errorf("claim message %s for %s: %w", msgID, consumer, err)
	}
	return tag.RowsAffected() == 1, nil
}

// ClaimMany claims msgIDs in one statement and returns the ones this
// transaction claimed first: a message absent from the result was
// applied before, or appears earlier in msgIDs. Like Claim, it must run in
// the transaction that applies the messages.
func ClaimMany(ctx context.Context, tx pgx.Tx, consumer string, msgIDs []string) (map[string]bool, error) {
	if consumer == "" {
		return nil, fmt.Errorf("%w (consumer %q)", ErrEmptyKey, consumer)
	}
	for _, id := range msgIDs {
		if id == "" {
			return nil, fmt.Errorf("%w (consumer %q, msg id %q)", ErrEmptyKey, consumer, id)
		}
	}
	rows, err := tx.Query(ctx, `INSERT INTO inbox (consumer, msg_id)
SELECT $1, id FROM unnest($2::text[]) WITH ORDINALITY AS m(id, ord) ORDER BY ord
ON CONFLICT DO NOTHING RETURNING msg_id`, consumer, msgIDs)
	if err != nil {
		return nil, fmt.Errorf("claim %d messages for %s: %w", len(msgIDs), consumer, err)
	}
	claimed, err := pgx.CollectRows(rows, pgx.RowTo[string])
	if err != nil {
		return nil, fmt.Errorf("claim %d messages for %s: %w", len(msgIDs), consumer, err)
	}
	out := make(map[string]bool, len(claimed))
	for _, id := range claimed {
		out[id] = true
	}
	return out, nil
}

// pruneBatch bounds how many rows one DELETE removes, so pruning a large
// backlog never holds long locks or one huge transaction.
const pruneBatch = 5000

// Prune deletes the claims of the named consumers older than olderThan and
// returns how many; with no consumer named it prunes every consumer's. Each
// service names its own consumers so that the shortest retention among
// services sharing a database never cuts another's short. The retention
// must exceed the longest time a message can be redelivered or republished
// (JetStream redeliveries, outbox republishes, stream replays); older
// duplicates are caught by the consumers' state guards.
func Prune(ctx context.Context, pool *pgxpool.Pool, olderThan time.Duration, consumers ...string) (int64, error) {
	if olderThan <= 0 {
		return 0, fmt.Errorf("prune inbox: olderThan is %s, must be positive", olderThan)
	}
	if consumers == nil {
		consumers = []string{} // nil would be NULL and match nothing
	}
	var total int64
	for {
		tag, err := pool.Exec(ctx, `
			DELETE FROM inbox WHERE ctid IN (
				SELECT ctid FROM inbox
				WHERE applied_at < now() - $1::interval
				  AND (cardinality($3::text[]) = 0 OR consumer = ANY($3::text[]))
				LIMIT $2
			)`, olderThan, pruneBatch, consumers)
		if err != nil {
			return total, fmt.Errorf("prune inbox: %w", err)
		}
		total += tag.RowsAffected()
		if tag.RowsAffected() < pruneBatch {
			return total, nil
		}
	}
}
