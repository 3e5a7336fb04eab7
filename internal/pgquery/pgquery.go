// Package pgquery holds what the stores' list queries (jobstore,
// retrystore, the audit log, the triggers' runs) build alike: a WHERE
// clause of conditions with numbered arguments, the page size they accept
// and the keyset cursor of the lists ordered by time.
package pgquery

import (
	"fmt"
	"strconv"
	"strings"
)

// DefaultLimit is the page size of a list asked with none.
const DefaultLimit = 100

// Where is a conjunction of SQL conditions and the query's arguments,
// numbered in the order they are added.
type Where struct {
	conds []string
	// Args are the query's arguments. Set it first to number some before
	// the conditions' (e.g. $1 of an INSERT around the SELECT).
	Args []any
}

// Add appends cond with each ? replaced, in order, by the placeholder
// ($n) of the next of vs.
func (w *Where) Add(cond string, vs ...any) {
	for _, v := range vs {
		cond = strings.Replace(cond, "?", w.Arg(v), 1)
	}
	w.conds = append(w.conds, cond)
}

// Equal adds col = v, unless v is empty: an empty field of a list's
// filter matches everything.
func (w *Where) Equal(col, v string) {
	if v != "" {
		w.Add(col+" = ?", v)
	}
}

// AnyOf adds col = ANY(vs), unless vs is empty (no value matches
// everything, as for Equal).
func (w *Where) AnyOf(col string, vs []string) {
	if len(vs) > 0 {
		w.Add(col+" = ANY(?::text[])", vs)
	}
}

// Arg appends v to the arguments and returns its placeholder, for a part
// of the query after the conditions (a LIMIT).
func (w *Where) Arg(v any) string {
	w.Args = append(w.Args, v)
	return "$" + strconv.Itoa(len(w.Args))
}

// SQL is " WHERE " and the conditions joined by AND, or "" without any.
func (w *Where) SQL() string {
	if len(w.conds) == 0 {
		return ""
	}
	return " WHERE " + strings.Join(w.conds, " AND ")
}

// Limit is the page size asked for: 0 means DefaultLimit, anything else
// outside 1 to max is an error.
func Limit(limit, max int) (int, error) {
	if limit == 0 {
		return DefaultLimit, nil
	}
	if limit < 1 || limit > max {
		return 0, fmt.Errorf("limit must be between 1 and %d, got %d", max, limit)
	}
	return limit, nil
}
