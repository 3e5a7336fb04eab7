package pgtext_test

import (
	"context"
	"encoding/json"
	"fmt"
	"testing"
	"unicode/utf8"

	"github.com/stretchr/testify/require"

	"github.com/retryd/retryd/migrations/pgtest"
	"github.com/retryd/retryd/pkg/contract"
	"github.com/retryd/retryd/stores/pgtext"
)

func TestMain(m *testing.M) { pgtest.Main(m) }

func TestCleanTextIsStorable(t *testing.T) {
	t.Parallel()
	pool := pgtest.NewPool(t)
	ctx := context.Background()
	for _, s := range []string{"plain", "", "nul\x00byte", "bad \xff utf-8", "cut é"[:6], "\x00"} {
		var got string
		require.NoError(t, pool.QueryRow(ctx, `SELECT $1::text`, pgtext.Clean(s)).Scan(&got), "%q", s)
		require.True(t, utf8.ValidString(got))
		md, err := json.Marshal(pgtext.CleanMap(map[string]any{"k" + s: s, "nested": map[string]any{"v": []any{s}}, "list": []string{s}}))
		require.NoError(t, err)
		_, err = pool.Exec(ctx, `SELECT $1::jsonb`, string(md))
		require.NoError(t, err, "%q", s)
	}
	require.Equal(t, "plain", pgtext.Clean("plain"))
	require.Equal(t, "a\uFFFDb", pgtext.Clean("a\x00b"))

	// Without Clean, Postgres refuses them: the reason the package exists.
	_, err := pool.Exec(ctx, `SELECT $1::text`, "nul\x00byte")
	require.Error(t, err)
	_, err = pool.Exec(ctx, `SELECT $1::jsonb`, `{"a":"\u0000"}`)
	require.Error(t, err)
}

func TestTruncateKeepsRunesWhole(t *testing.T) {
	t.Parallel()
	s := "ab" + "é" + "c" // é is 2 bytes, at 2..3
	require.Equal(t, "ab", pgtext.Truncate(s, 3))
	require.Equal(t, "abé", pgtext.Truncate(s, 4))
	require.Equal(t, s, pgtext.Truncate(s, 10))
	require.Equal(t, "", pgtext.Truncate("é", 1))
}

func ExampleClean() {
	fmt.Printf("%+q\n", pgtext.Clean("cancelled by op\x00erator"))
	// Output: "cancelled by op\ufffderator"
}

func TestCheck(t *testing.T) {
	t.Parallel()
	require.NoError(t, pgtext.Check("reason", "fine é", 16))
	var fe *contract.FieldError
	err := pgtext.Check("reason", "nul\x00", 16)
	require.ErrorIs(t, err, contract.ErrInvalid)
	require.ErrorAs(t, err, &fe)
	require.Equal(t, "reason", fe.Field)
	err = pgtext.Check("by", "toolong", 3)
	require.ErrorAs(t, err, &fe)
	require.Equal(t, "by", fe.Field)
	require.Contains(t, fe.Reason, "longer than 3 bytes")
}
