package main

import (
	"fmt"
	"net/http"
	"time"

	"github.com/spf13/cobra"

	"github.com/retryd/retryd/internal/auth"
)

func newTokensCmd(g *globals) *cobra.Command {
	cmd := group(&cobra.Command{
		Use:     "tokens",
		Aliases: []string{"token"},
		Short:   "API tokens: create, list, revoke (admin)",
		Long: `API tokens authenticate every call to the HTTP APIs. Each has a name (what
audit records show as "by") and a role: producer (send events), viewer
(read), operator (viewer, and cancel, retry, pause, resume) or admin
(everything: policies, triggers, sources, tokens). Managing tokens needs an
admin token (--token or RETRYD_TOKEN). See docs/security.md.`,
	})
	cmd.AddCommand(newTokensCreateCmd(g), newTokensListCmd(g), newTokensRevokeCmd(g))
	return cmd
}

func newTokensCreateCmd(g *globals) *cobra.Command {
	var name, role string
	var expires time.Duration
	cmd := &cobra.Command{
		Use:   "create",
		Short: "Create a token and print it (it is shown this once)",
		Example: `  retryd tokens create --name shop-producer --role producer
  retryd tokens create --name oncall --role operator --expires 720h`,
		Args: args(0),
		RunE: func(cmd *cobra.Command, _ []string) error {
			if name == "" {
				return usageErrorf(cmd, "--name is required")
			}
			if expires < 0 {
				return usageErrorf(cmd, "--expires must be positive, got %s", expires)
			}
			c, err := g.client()
			if err != nil {
				return err
			}
			req := auth.CreateRequest{Name: name, Role: role}
			if expires > 0 {
				at := time.Now().Add(expires).UTC()
				req.ExpiresAt = &at
			}
			var res auth.Created
			raw, err := c.post(cmd.Context(), "/v1/tokens", req, &res)
			if err != nil {
				return fmt.Errorf("create token: %w", err)
			}
			if g.json {
				return printJSON(g.stdout, raw)
			}
			fmt.Fprintln(g.stdout, res.Secret)
			exp := "never"
			if res.ExpiresAt != nil {
				exp = res.ExpiresAt.Format(time.RFC3339)
			}
			fmt.Fprintf(g.stderr, "token %s (%s, role %s, expires %s): store it now, it is not shown again\n", res.ID, res.Name, res.Role, exp)
			return nil
		},
	}
	f := cmd.Flags()
	f.StringVar(&name, "name", "", "the token's name: who uses it (required; audit records show it)")
	f.StringVar(&role, "role", "viewer", "producer, viewer, operator or admin")
	f.DurationVar(&expires, "expires", 0, "lifetime, e.g. 720h (default: until revoked)")
	return cmd
}

func newTokensListCmd(g *globals) *cobra.Command {
	return &cobra.Command{
		Use:   "list",
		Short: "List tokens (never their secrets), revoked ones too",
		Args:  args(0),
		RunE: func(cmd *cobra.Command, _ []string) error {
			c, err := g.client()
			if err != nil {
				return err
			}
			var res tokenList
			raw, err := c.get(cmd.Context(), "/v1/tokens", nil, &res)
			if err != nil {
				return fmt.Errorf("list tokens: %w", err)
			}
			if g.json {
				return printJSON(g.stdout, raw)
			}
			opt := func(t *time.Time) string {
				if t == nil {
					return "-"
				}
				return t.Local().Format(time.DateTime)
			}
			t := newTable(g.stdout, "ID", "NAME", "ROLE", "CREATED", "EXPIRES", "LAST USED", "REVOKED")
			for _, tk := range res.Tokens {
				t.row(tk.ID, tk.Name, tk.Role.String(), tk.CreatedAt.Local().Format(time.DateTime), opt(tk.ExpiresAt), opt(tk.LastUsedAt), opt(tk.RevokedAt))
			}
			return t.flush()
		},
	}
}

func newTokensRevokeCmd(g *globals) *cobra.Command {
	return &cobra.Command{
		Use:   "revoke ID",
		Short: "Revoke a token; every service refuses it within seconds",
		Args:  args(1, "ID"),
		RunE: func(cmd *cobra.Command, a []string) error {
			c, err := g.client()
			if err != nil {
				return err
			}
			var res auth.Token
			raw, err := c.call(cmd.Context(), http.MethodDelete, "/v1/tokens/"+seg(a[0]), nil, nil, &res)
			if err != nil {
				return fmt.Errorf("revoke token: %w", err)
			}
			if g.json {
				return printJSON(g.stdout, raw)
			}
			fmt.Fprintf(g.stdout, "revoked %s (%s)\n", res.ID, res.Name)
			return nil
		},
	}
}
