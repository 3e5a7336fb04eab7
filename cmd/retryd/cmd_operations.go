package main

import (
	"fmt"
	"net/url"
	"slices"
	"strconv"
	"strings"
	"time"

	"github.com/spf13/cobra"

	"github.com/retryd/retryd/stores/jobstore"
)

// operationStatuses are the statuses GET /v1/operations filters on.
var operationStatuses = []string{"running", "completed", "cancelled"}

func newJobsOperationsCmd(g *globals) *cobra.Command {
	var status string
	var pages *pager
	cmd := &cobra.Command{
		Use:   "operations",
		Short: "List bulk retries, newest first (--status running|completed|cancelled)",
		Example: `  retryd jobs operations
  retryd jobs operations --status running`,
		Args: func(cmd *cobra.Command, a []string) error {
			if len(a) > 0 {
				// It was an alias of "operation ID" until 2026-11-26.
				return usageErrorf(cmd, "%s lists the bulk retries and takes no arguments; to show one: retryd jobs operation %s",
					cmd.CommandPath(), a[0])
			}
			return nil
		},
		RunE: func(cmd *cobra.Command, _ []string) error {
			q := url.Values{}
			if status != "" {
				if !slices.Contains(operationStatuses, status) {
					return usageErrorf(cmd, "--status %q is not one of %s", status, strings.Join(operationStatuses, ", "))
				}
				q.Set("status", status)
			}
			return list(cmd, g, pages, q, listing[operationPage, jobstore.Operation]{
				path: "/v1/operations", what: "operations", none: "No bulk operations match.", more: "operations",
				rows:    func(p operationPage) ([]jobstore.Operation, string) { return p.Operations, p.NextCursor },
				page:    func(ops []jobstore.Operation) operationPage { return operationPage{Operations: ops} },
				columns: []string{"ID", "STATUS", "CREATED", "BY", "RATE", "TOTAL", "RELEASED", "SKIPPED", "FAILED", "PENDING", "REASON"},
				row: func(o jobstore.Operation, _ time.Time) []string {
					return []string{o.ID, o.Status, o.CreatedAt.Local().Format(time.DateTime), o.RequestedBy, fmt.Sprintf("%.4g/s", o.RatePerSecond),
						strconv.Itoa(o.Total), strconv.Itoa(o.Released), strconv.Itoa(o.Skipped), strconv.Itoa(o.Failed),
						strconv.Itoa(o.Pending), trunc(o.Reason, 60)}
				},
			})
		},
	}
	f := cmd.Flags()
	f.StringVar(&status, "status", "", "only operations in this status: "+strings.Join(operationStatuses, ", "))
	pages = addPager(cmd, 1000)
	return cmd
}
