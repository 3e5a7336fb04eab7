package pgquery_test

import (
	"testing"

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
