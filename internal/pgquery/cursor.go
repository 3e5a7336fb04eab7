package pgquery

import (
	"encoding/base64"
	"strings"
	"time"
)

// A time cursor marks where a list ordered newest first by a timestamp
// and then an id stopped: the last row's pair, which the next page reads
// below with (at, id) < ($n, $m). The jobs list (updated_at, job_id) and
// the runs list (requested_at, run_id) page this way. It is opaque to
// callers, and readable only by DecodeTimeCursor.

// EncodeTimeCursor is the cursor after the row (at, id).
func EncodeTimeCursor(at time.Time, id string) string {
	return base64.RawURLEncoding.EncodeToString([]byte(at.UTC().Format(time.RFC3339Nano) + "|" + id))
}

// DecodeTimeCursor reads a cursor of EncodeTimeCursor; ok is false for
// any other string, which the store reports as its own bad-cursor error.
func DecodeTimeCursor(c string) (at time.Time, id string, ok bool) {
	b, err := base64.RawURLEncoding.DecodeString(c)
	if err != nil {
		return time.Time{}, "", false
	}
	ts, id, ok := strings.Cut(string(b), "|")
	if !ok || id == "" {
		return time.Time{}, "", false
	}
	at, err = time.Parse(time.RFC3339Nano, ts)
	if err != nil {
		return time.Time{}, "", false
	}
	return at, id, true
}

// BeforeTimeCursor adds the condition that reads the page after cursor,
// a cursor of EncodeTimeCursor, of a list ordered newest first by the
// columns cols (the timestamp's, then the id's, e.g. "updated_at, job_id").
// No cursor adds nothing; ok is false for a string EncodeTimeCursor did
// not make.
func (w *Where) BeforeTimeCursor(cols, cursor string) (ok bool) {
	if cursor == "" {
		return true
	}
	at, id, ok := DecodeTimeCursor(cursor)
	if !ok {
		return false
	}
	w.Add("("+cols+") < (?, ?)", at, id)
	return true
}
