package main

import (
	"bytes"
	"encoding/json"
	"fmt"
	"net/url"
	"strconv"
	"time"

	"github.com/spf13/cobra"
)

// maxAuditLimit is the largest page GET /v1/audit serves.
const maxAuditLimit = 500

func newAuditCmd(g *globals) *cobra.Command {
	var principal, action, since, cursor string
	var limit int
	var all bool
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
			if limit < 1 || limit > maxAuditLimit {
				return usageErrorf(cmd, "--limit must be between 1 and %d, got %d", maxAuditLimit, limit)
			}
			q := url.Values{}
			for k, v := range map[string]string{"principal": principal, "action": action, "cursor": cursor} {
				if v != "" {
					q.Set(k, v)
				}
			}
			if since != "" {
				t, err := parseTimeFlag(since, time.Now())
				if err != nil {
					return usageErrorf(cmd, "--since: %v", err)
				}
				q.Set("since", t.UTC().Format(time.RFC3339))
			}
			q.Set("limit", strconv.Itoa(limit))
			c, err := g.client()
			if err != nil {
				return err
			}
			entries, single, next, err := fetchPages(cmd.Context(), c, "/v1/audit", q, all,
				func(p auditPage) ([]auditEntry, string) { return p.Entries, p.NextCursor })
			if err != nil {
				return fmt.Errorf("list audit: %w", err)
			}
			if g.json {
				if single != nil {
					return printJSON(g.stdout, single)
				}
				return writeJSON(g.stdout, auditPage{Entries: entries})
			}
			if len(entries) == 0 {
				fmt.Fprintln(g.stdout, "No audit entries match.")
				return nil
			}
			t := newTable(g.stdout, "AT", "PRINCIPAL", "ROLE", "ACTION", "TARGET", "DETAIL")
			for _, e := range entries {
				t.row(e.At.Local().Format(time.DateTime), e.Principal, e.Role, e.Action, e.Target, compactDetail(e.Detail))
			}
			if err := t.flush(); err != nil {
				return err
			}
			if next != "" {
				fmt.Fprintf(g.stderr, "More entries: add --cursor %s (or --all).\n", next)
			}
			return nil
		},
	}
	f := cmd.Flags()
	f.StringVar(&principal, "principal", "", "only this token name's actions")
	f.StringVar(&action, "action", "", "only this action, such as source.pause or token.revoke")
	f.StringVar(&since, "since", "", "only entries from then on: RFC 3339 or a duration back from now such as 24h")
	f.IntVar(&limit, "limit", 100, fmt.Sprintf("page size (1-%d)", maxAuditLimit))
	f.StringVar(&cursor, "cursor", "", "continue after a previous page")
	f.BoolVar(&all, "all", false, "fetch every page")
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
