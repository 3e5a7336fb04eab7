package pgdb_test

import (
	"errors"
	"fmt"
	"net/http"
	"net/http/httptest"
	"testing"

	"github.com/jackc/pgx/v5"
	"github.com/stretchr/testify/require"

	"github.com/retryd/retryd/internal/serve"
	"github.com/retryd/retryd/stores/pgdb"
)

// A missing row is pgdb.ErrNotFound, and a store's sentinel passed on as
// it is gets its status from the HTTP layer: a handler need not map it.
func TestSentinels(t *testing.T) {
	t.Parallel()
	require.ErrorIs(t, pgdb.NotFound(fmt.Errorf("get: %w", pgx.ErrNoRows)), pgdb.ErrNotFound)
	other := errors.New("connection refused")
	require.Same(t, other, pgdb.NotFound(other))
	require.NoError(t, pgdb.NotFound(nil))

	for err, status := range map[error]int{
		fmt.Errorf("get retry %q: %w", "r1", pgdb.ErrNotFound):                   http.StatusNotFound,
		fmt.Errorf("create trigger t1: it already exists: %w", pgdb.ErrConflict): http.StatusConflict,
	} {
		rec := httptest.NewRecorder()
		serve.WriteError(rec, err)
		require.Equal(t, status, rec.Code, err.Error())
	}
	rec := httptest.NewRecorder()
	serve.ReplyPage(rec, nil, fmt.Errorf("list retries: %w", pgdb.ErrBadCursor))
	require.Equal(t, http.StatusBadRequest, rec.Code)
}
