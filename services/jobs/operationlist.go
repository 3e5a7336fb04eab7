package jobs

import (
	"errors"
	"fmt"
	"net/http"
	"slices"
	"strconv"

	"github.com/retryd/retryd/internal/serve"
	"github.com/retryd/retryd/projections/jobstore"
)

// operationStatuses are the statuses GET /v1/operations filters on.
var operationStatuses = []string{jobstore.OperationRunning, jobstore.OperationCompleted, jobstore.OperationCancelled}

// handleListOperations is GET /v1/operations: the bulk operations, newest
// first, a page at a time, so an operator finds a bulk retry whose id
// they no longer have.
func (a *API) handleListOperations(w http.ResponseWriter, r *http.Request) {
	q := r.URL.Query()
	status := q.Get("status")
	if status != "" && !slices.Contains(operationStatuses, status) {
		serve.WriteError(w, invalid("status", fmt.Sprintf("%q is not one of running, completed, cancelled", status)))
		return
	}
	limit := 0
	if v := q.Get("limit"); v != "" {
		var err error
		if limit, err = strconv.Atoi(v); err != nil || limit < 1 || limit > jobstore.MaxListLimit {
			serve.WriteError(w, invalid("limit", fmt.Sprintf("must be between 1 and %d", jobstore.MaxListLimit)))
			return
		}
	}
	page, err := jobstore.ListOperations(r.Context(), a.cfg.Pool, status, limit, q.Get("cursor"))
	if errors.Is(err, jobstore.ErrBadCursor) {
		serve.WriteError(w, invalid("cursor", "is not a cursor this API returned"))
		return
	}
	if err != nil {
		a.internal(w, err)
		return
	}
	serve.WriteJSON(w, http.StatusOK, page)
}
