package jobs

import (
	"fmt"
	"net/http"
	"slices"

	"github.com/retryd/retryd/internal/serve"
	"github.com/retryd/retryd/stores/jobstore"
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
	a.writePage(w, r, q, func(limit int, cursor string) (any, error) {
		return jobstore.ListOperations(r.Context(), a.cfg.Pool, status, limit, cursor)
	})
}
