package retrystore

import (
	"context"
	"encoding/json"
	"fmt"
	"time"
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
	At            time.Time       `json:"at"`
}

// InsertHistory appends entries in order, in one statement. ID is set by
// the database, and so is At when it is zero (the transaction's now()).
func InsertHistory(ctx context.Context, q Querier, entries ...HistoryEntry) error {
	if len(entries) == 0 {
		return nil
	}
	n := len(entries)
	var (
		kinds, items, events, jobTypes, sources     = make([]string, n), make([]string, n), make([]string, n), make([]string, n), make([]string, n)
		classes, messages, decidedBy, policies, ids = make([]string, n), make([]string, n), make([]string, n), make([]string, n), make([]string, n)
		details                                     = make([]string, n)
		attempts, versions                          = make([]int32, n), make([]int32, n)
		delays                                      = make([]*int64, n)
		nexts, ats                                  = make([]*time.Time, n), make([]*time.Time, n)
		ords                                        = make([]int32, n)
	)
	for i, e := range entries {
		kinds[i], items[i], events[i], jobTypes[i], sources[i] = e.Kind, e.ItemID, e.Event, e.JobType, e.Source
		classes[i], messages[i], decidedBy[i], policies[i], ids[i] = e.ErrorClass, e.ErrorMessage, e.DecidedBy, e.PolicyName, e.MsgID
		attempts[i], versions[i], delays[i], nexts[i], ords[i] = int32(e.Attempt), int32(e.PolicyVersion), e.DelayMS, e.NextAttemptAt, int32(i)
		if !e.At.IsZero() {
			ats[i] = &e.At
		}
		details[i] = "{}"
		if len(e.Detail) > 0 {
			details[i] = string(e.Detail)
		}
	}
	// WITH ORDINALITY + ORDER BY keeps the identity values in the order of
	// entries, so history reads back in the order facts happened.
	_, err := q.Exec(ctx, `
INSERT INTO retry_history (kind, item_id, attempt, event, job_type, source, error_class,
	error_message, delay_ms, decided_by, policy_name, policy_version, next_attempt_at, detail, msg_id, at)
SELECT kind, item_id, attempt, event, job_type, source, error_class, error_message, delay_ms,
	decided_by, policy_name, policy_version, next_attempt_at, detail::jsonb, msg_id, coalesce(at, now())
FROM unnest($1::text[], $2::text[], $3::int[], $4::text[], $5::text[], $6::text[], $7::text[],
	$8::text[], $9::bigint[], $10::text[], $11::text[], $12::int[], $13::timestamptz[], $14::text[],
	$15::text[], $16::int[], $17::timestamptz[])
	AS h(kind, item_id, attempt, event, job_type, source, error_class, error_message, delay_ms,
	decided_by, policy_name, policy_version, next_attempt_at, detail, msg_id, ord, at)
ORDER BY ord`,
		kinds, items, attempts, events, jobTypes, sources, classes, messages, delays, decidedBy,
		policies, versions, nexts, details, ids, ords, ats)
	if err != nil {
		return fmt.Errorf("insert retry history: %w", err)
	}
	return nil
}

const historyColumns = `id, kind, item_id, attempt, event, job_type, source, error_class, error_message,
	delay_ms, decided_by, policy_name, policy_version, next_attempt_at, detail, msg_id, at`

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
			&e.NextAttemptAt, (*[]byte)(&e.Detail), &e.MsgID, &e.At); err != nil {
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
