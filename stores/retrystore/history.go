package retrystore

import (
	"context"
	"encoding/json"
	"fmt"
	"time"

	"github.com/jackc/pgx/v5"
)

// HistoryEntry is one lifecycle fact of an item: a row of retry_history.
// Together the entries of an item answer "why did it retry?": every
// failure with its class, every decision with its delay, policy and what
// decided it, every due emission and the outcome.
type HistoryEntry struct {
	ID            int64           `json:"id"`
	Kind          string          `json:"kind"`
	ItemID        string          `json:"item_id"`
	Attempt       int             `json:"attempt"`
	Event         string          `json:"event"`
	JobType       string          `json:"job_type,omitempty"`
	Source        string          `json:"source,omitempty"`
	ErrorClass    string          `json:"error_class,omitempty"`
	ErrorMessage  string          `json:"error_message,omitempty"`
	DelayMS       *int64          `json:"delay_ms,omitempty"`
	DecidedBy     string          `json:"decided_by,omitempty"`
	PolicyName    string          `json:"policy_name,omitempty"`
	PolicyVersion int             `json:"policy_version,omitempty"`
	NextAttemptAt *time.Time      `json:"next_attempt_at,omitempty"`
	Detail        json.RawMessage `json:"detail,omitempty"`
	MsgID         string          `json:"msg_id,omitempty"`
	// Executor is the worker instance that ran the attempt, as the
	// owner's failed, held or succeeded fact named it (migration 00105);
	// empty when it did not say and on the scheduler's own rows.
	Executor string    `json:"executor,omitempty"`
	At       time.Time `json:"at"`
}

// InsertHistory appends entries in order with one COPY: the due emission
// writes a row for every retry that comes due, and COPY costs Postgres
// less per row than any INSERT. ID is set by the database, in the order of
// entries, so history reads back in the order facts happened. A zero At
// means the transaction's now().
func InsertHistory(ctx context.Context, q Copier, entries ...HistoryEntry) error {
	if len(entries) == 0 {
		return nil
	}
	var txNow time.Time
	for _, e := range entries {
		if e.At.IsZero() {
			if err := q.QueryRow(ctx, `SELECT now()`).Scan(&txNow); err != nil {
				return fmt.Errorf("insert retry history: read now: %w", err)
			}
			break
		}
	}
	rows := make([][]any, len(entries))
	for i, e := range entries {
		at := e.At
		if at.IsZero() {
			at = txNow
		}
		detail := json.RawMessage(`{}`)
		if len(e.Detail) > 0 {
			detail = e.Detail
		}
		rows[i] = []any{e.Kind, e.ItemID, int32(e.Attempt), e.Event, e.JobType, e.Source, e.ErrorClass,
			e.ErrorMessage, e.DelayMS, e.DecidedBy, e.PolicyName, int32(e.PolicyVersion), e.NextAttemptAt,
			detail, e.MsgID, e.Executor, at}
	}
	if _, err := q.CopyFrom(ctx, pgx.Identifier{"retry_history"}, historyCopyColumns, pgx.CopyFromRows(rows)); err != nil {
		return fmt.Errorf("insert retry history: %w", err)
	}
	return nil
}

var historyCopyColumns = []string{"kind", "item_id", "attempt", "event", "job_type", "source", "error_class",
	"error_message", "delay_ms", "decided_by", "policy_name", "policy_version", "next_attempt_at", "detail", "msg_id", "executor", "at"}

const historyColumns = `id, kind, item_id, attempt, event, job_type, source, error_class, error_message,
	delay_ms, decided_by, policy_name, policy_version, next_attempt_at, detail, msg_id, executor, at`

// History returns every entry of an item, oldest first.
func History(ctx context.Context, q Querier, kind, itemID string) ([]HistoryEntry, error) {
	rows, err := q.Query(ctx, `SELECT `+historyColumns+` FROM retry_history
WHERE kind = $1 AND item_id = $2 ORDER BY id`, kind, itemID)
	if err != nil {
		return nil, fmt.Errorf("read history of %s/%s: %w", kind, itemID, err)
	}
	defer rows.Close()
	var out []HistoryEntry
	for rows.Next() {
		var e HistoryEntry
		if err := rows.Scan(&e.ID, &e.Kind, &e.ItemID, &e.Attempt, &e.Event, &e.JobType, &e.Source,
			&e.ErrorClass, &e.ErrorMessage, &e.DelayMS, &e.DecidedBy, &e.PolicyName, &e.PolicyVersion,
			&e.NextAttemptAt, (*[]byte)(&e.Detail), &e.MsgID, &e.Executor, &e.At); err != nil {
			return nil, fmt.Errorf("read history of %s/%s: %w", kind, itemID, err)
		}
		if string(e.Detail) == "{}" {
			e.Detail = nil
		}
		out = append(out, e)
	}
	if err := rows.Err(); err != nil {
		return nil, fmt.Errorf("read history of %s/%s: %w", kind, itemID, err)
	}
	return out, nil
}
