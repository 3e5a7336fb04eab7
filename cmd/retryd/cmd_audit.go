package main

import (
	"bytes"
	"encoding/json"
	"time"

	"github.com/spf13/cobra"

	"github.com/retryd/retryd/internal/audit"
)

// maxAuditLimit is the largest page GET /v1/audit serves.
const maxAuditLimit = 500

func newAuditCmd(g *globals) *cobra.Command {
	var principal, action, since string
	var pages *pager
	cmd := &cobra.Command{
		Use:   "audit",
		Short: "The audit trail: who did which operator or admin action (admin)",
		Long: `audit lists who did which operator or admin action, newest first: cancels
and retries, source pauses, resumes and settings, event cancels, policy,
trigger and token changes. Each entry names the token that made the
request (never a name in its body) and its role. Reading it needs an admin
token (--token or RETRYD_TOKEN). See docs/security.md.`,
		Example: `  retryd audit
  retryd audit --principal oncall --since 24h
  retryd audit --action source.pause --json`,
		Args: args(0),
		RunE: func(cmd *cobra.Command, _ []string) error {
			q := filterQuery(map[string]string{"principal": principal, "action": action})
			if since != "" {
				t, err := parseTimeFlag(since, time.Now())
				if err != nil {
					return usageErrorf(cmd, "--since: %v", err)
				}
				q.Set("since", t.UTC().Format(time.RFC3339))
			}
			return list(cmd, g, pages, q, listing[auditPage, audit.Entry]{
				path: "/v1/audit", what: "audit", none: "No audit entries match.", more: "entries",
				rows:    func(p auditPage) ([]audit.Entry, string) { return p.Entries, p.NextCursor },
				page:    func(entries []audit.Entry) auditPage { return auditPage{Entries: entries} },
				columns: []string{"AT", "PRINCIPAL", "ROLE", "ACTION", "TARGET", "DETAIL"},
				row: func(e audit.Entry, _ time.Time) []string {
					return []string{e.At.Local().Format(time.DateTime), e.Principal, e.Role, e.Action, e.Target, compactDetail(e.Detail)}
				},
			})
		},
	}
	f := cmd.Flags()
	f.StringVar(&principal, "principal", "", "only this token name's actions")
	f.StringVar(&action, "action", "", "only this action, such as source.pause or token.revoke")
	f.StringVar(&since, "since", "", "only entries from then on: RFC 3339 or a duration back from now such as 24h")
	pages = addPager(cmd, maxAuditLimit)
	return cmd
}

// compactDetail prints an entry's detail on one line; "{}" prints nothing.
func compactDetail(raw json.RawMessage) string {
	var b bytes.Buffer
	if err := json.Compact(&b, raw); err != nil || b.String() == "{}" {
		return ""
	}
	return b.String()
}
