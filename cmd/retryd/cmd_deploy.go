package main

import (
	"context"
	"fmt"
	"net/http"
	"strings"
	"time"

	"github.com/spf13/cobra"

	"github.com/retryd/retryd/cmd/retryd/internal/devcerts"
)

// Commands that deployments use: certificates for a development NATS and
// an HTTP probe for distroless containers (no curl there).

func newDevCertsCmd(g *globals) *cobra.Command {
	var dir string
	var hosts []string
	var validity time.Duration
	var keep bool
	cmd := &cobra.Command{
		Use:   "dev-certs",
		Short: "Write a throwaway CA and NATS server certificate (compose, tests)",
		Long: `dev-certs writes ca.crt, tls.crt and tls.key into --dir: a new certificate
authority and a server certificate it signed for --hosts. docker-compose.yml
runs it once so the NATS server has TLS. Use your own PKI in production.`,
		Example: `  retryd dev-certs --dir ./tls --hosts nats,localhost,127.0.0.1`,
		Args:    args(0),
		RunE: func(cmd *cobra.Command, _ []string) error {
			if dir == "" {
				return usageErrorf(cmd, "--dir is required")
			}
			if validity < time.Hour {
				return usageErrorf(cmd, "--valid-for must be at least 1h")
			}
			f, wrote, err := devcerts.Generate(dir, hosts, validity, keep)
			if err != nil {
				return err
			}
			if !wrote {
				fmt.Fprintf(g.stdout, "Kept the certificates in %s.\n", dir)
				return nil
			}
			fmt.Fprintf(g.stdout, "Wrote %s, %s and %s for %s.\n", f.CA, f.Cert, f.Key, strings.Join(hosts, ", "))
			return nil
		},
	}
	cmd.Flags().StringVar(&dir, "dir", "", "directory to write to")
	cmd.Flags().StringSliceVar(&hosts, "hosts", []string{"localhost", "127.0.0.1"}, "host names and IPs of the server certificate")
	cmd.Flags().DurationVar(&validity, "valid-for", 365*24*time.Hour, "validity of the certificates")
	cmd.Flags().BoolVar(&keep, "keep", false, "leave existing files alone")
	return cmd
}

func newProbeCmd(g *globals) *cobra.Command {
	return &cobra.Command{
		Use:     "probe URL",
		Short:   "Exit 0 when URL answers 2xx (container health checks)",
		Example: `  retryd probe http://127.0.0.1:8080/readyz`,
		Args:    args(1, "URL"),
		RunE: func(cmd *cobra.Command, a []string) error {
			ctx, cancel := context.WithTimeout(cmd.Context(), min(g.timeout, 5*time.Second))
			defer cancel()
			req, err := http.NewRequestWithContext(ctx, http.MethodGet, a[0], nil)
			if err != nil {
				return usageErrorf(cmd, "%v", err)
			}
			transport, err := g.transport()
			if err != nil {
				return err
			}
			resp, err := (&http.Client{Transport: transport}).Do(req)
			if err != nil {
				return fmt.Errorf("probe %s: %w", a[0], err)
			}
			resp.Body.Close()
			if resp.StatusCode/100 != 2 {
				return fmt.Errorf("probe %s: HTTP %d", a[0], resp.StatusCode)
			}
			return nil
		},
	}
}
