package pgquery_test

import (
	"encoding/base64"
	"testing"
	"time"

	"github.com/stretchr/testify/require"

	"github.com/retryd/retryd/internal/pgquery"
)

func TestWhereNumbersArguments(t *testing.T) {
	t.Parallel()
	w := pgquery.Where{Args: []any{"op-1"}}
	require.Equal(t, "", w.SQL())
	w.Add("kind = ?", "job")
	w.Add("(kind, item_id) > (?, ?)", "job", "j-9")
	w.Add("status = ANY(?::text[])", []string{"failed"})
	require.Equal(t, " WHERE kind = $2 AND (kind, item_id) > ($3, $4) AND status = ANY($5::text[])", w.SQL())
	require.Equal(t, "$6", w.Arg(101))
	require.Equal(t, []any{"op-1", "job", "job", "j-9", []string{"failed"}, 101}, w.Args)
}

// Equal and AnyOf add nothing for an empty filter field.
func TestEqualAndAnyOf(t *testing.T) {
	t.Parallel()
	var w pgquery.Where
	w.Equal("kind", "")
	w.AnyOf("status", nil)
	require.Equal(t, "", w.SQL())
	w.Equal("kind", "job")
	w.AnyOf("status", []string{"failed", "dead"})
	require.Equal(t, " WHERE kind = $1 AND status = ANY($2::text[])", w.SQL())
	require.Equal(t, []any{"job", []string{"failed", "dead"}}, w.Args)
}

func TestLimit(t *testing.T) {
	t.Parallel()
	n, err := pgquery.Limit(0, 500)
	require.NoError(t, err)
	require.Equal(t, pgquery.DefaultLimit, n)
	n, err = pgquery.Limit(500, 500)
	require.NoError(t, err)
	require.Equal(t, 500, n)
	_, err = pgquery.Limit(501, 500)
	require.EqualError(t, err, "limit must be between 1 and 500, got 501")
	_, err = pgquery.Limit(-1, 500)
	require.EqualError(t, err, "limit must be between 1 and 500, got -1")
}

func TestTimeCursorRoundTrips(t *testing.T) {
	t.Parallel()
	at := time.Date(2026, 11, 26, 9, 30, 0, 123456789, time.FixedZone("CET", 3600))
	gotAt, id, ok := pgquery.DecodeTimeCursor(pgquery.EncodeTimeCursor(at, "run-01|x"))
	require.True(t, ok)
	require.True(t, at.Equal(gotAt))
	require.Equal(t, "run-01|x", id)
	for _, bad := range []string{"", "!!", base64.RawURLEncoding.EncodeToString([]byte("no-bar")),
		base64.RawURLEncoding.EncodeToString([]byte("2026-11-26T09:30:00Z|")), base64.RawURLEncoding.EncodeToString([]byte("yesterday|j-1"))} {
		_, _, ok := pgquery.DecodeTimeCursor(bad)
		require.False(t, ok, bad)
	}
}

// BeforeTimeCursor adds nothing for the first page, the keyset condition
// for a cursor it made, and refuses any other string.
func TestBeforeTimeCursor(t *testing.T) {
	t.Parallel()
	var w pgquery.Where
	require.True(t, w.BeforeTimeCursor("updated_at, job_id", ""))
	require.Equal(t, "", w.SQL())
	at := time.Date(2026, 11, 26, 9, 30, 0, 0, time.UTC)
	require.True(t, w.BeforeTimeCursor("updated_at, job_id", pgquery.EncodeTimeCursor(at, "j-1")))
	require.Equal(t, " WHERE (updated_at, job_id) < ($1, $2)", w.SQL())
	require.Equal(t, []any{at, "j-1"}, w.Args)
	require.False(t, w.BeforeTimeCursor("updated_at, job_id", "!!"))
	require.Len(t, w.Args, 2)
}
