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
	"github.com/retryd/retryd/pkg/contract"
	"github.com/retryd/retryd/projections/jobstore"
	"github.com/retryd/retryd/projections/pgdb"
	"github.com/retryd/retryd/projections/retrystore"
)

// Every store's not-found error is the one contract.ErrNotFound, so a
// handler can pass a store's error on and the client gets a 404. (The
// stores the services own internally check theirs in their own tests.)
func TestOneNotFound(t *testing.T) {
	t.Parallel()
	for name, err := range map[string]error{
		"retrystore": retrystore.ErrNotFound, "jobstore": jobstore.ErrNotFound, "serve": serve.ErrNotFound,
	} {
		require.Same(t, contract.ErrNotFound, err, name)
	}

	require.ErrorIs(t, pgdb.NotFound(fmt.Errorf("get: %w", pgx.ErrNoRows)), contract.ErrNotFound)
	other := errors.New("connection refused")
	require.Same(t, other, pgdb.NotFound(other))
	require.NoError(t, pgdb.NotFound(nil))

	rec := httptest.NewRecorder()
	serve.WriteError(rec, fmt.Errorf("get retry %q: %w", "r1", retrystore.ErrNotFound))
	require.Equal(t, http.StatusNotFound, rec.Code)
}
