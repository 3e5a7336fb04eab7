package main

import (
	"fmt"
	"strconv"
	"time"

	"github.com/spf13/cobra"
)

func newSourcesCmd(g *globals) *cobra.Command {
	cmd := group(&cobra.Command{
		Use:     "sources",
		Aliases: []string{"source"},
		Short:   "Event sources: rate limits, pauses and deferred events",
	})
	cmd.AddCommand(newSourcesListCmd(g), newSourcesShowCmd(g), newSourcesSetCmd(g),
		newSourcesPauseCmd(g), newSourcesResumeCmd(g))
	return cmd
}

func newSourcesListCmd(g *globals) *cobra.Command {
	return &cobra.Command{
		Use:   "list",
		Short: "List the sources that have a gate (rate limit, pause or allowed types)",
		Args:  args(0),
		RunE: func(cmd *cobra.Command, _ []string) error {
			var res sourceList
			if done, err := g.fetch(cmd, "/v1/sources", nil, &res, doing("list sources")); done {
				return err
			}
			if len(res.Sources) == 0 {
				fmt.Fprintln(g.stdout, "No source has a gate configured.")
				return nil
			}
			now := time.Now()
			t := newTable(g.stdout, "SOURCE", "RATE LIMIT", "PAUSED", "DEFERRED", "ALLOWED TYPES", "UPDATED")
			for _, s := range res.Sources {
				t.row(s.Source, rateLimit(s), paused(s, now), strconv.FormatInt(s.Deferred, 10),
					joinOr(s.AllowedTypes, "any"), relTime(&s.UpdatedAt, now))
			}
			return t.flush()
		},
	}
}

func rateLimit(s sourceView) string {
	if s.RateLimit == nil {
		return "none"
	}
	return fmt.Sprintf("%d per %s", *s.RateLimit, s.RateWindow)
}

func paused(s sourceView, now time.Time) string {
	switch {
	case !s.Paused:
		return "no"
	case s.PausedUntil != nil && !s.PausedUntil.After(now):
		return "no (pause ended " + relTime(s.PausedUntil, now) + ")"
	case s.PausedUntil != nil:
		return "until " + stamp(s.PausedUntil, now)
	}
	return "yes"
}

func printSource(g *globals, s sourceView) error {
	now := time.Now()
	pairs := []string{
		"Source", s.Source,
		"Rate limit", rateLimit(s),
		"Paused", paused(s, now),
	}
	if s.PauseReason != "" {
		pairs = append(pairs, "Pause reason", s.PauseReason)
	}
	pairs = append(pairs,
		"Deferred events", strconv.FormatInt(s.Deferred, 10),
		"Allowed types", joinOr(s.AllowedTypes, "any"),
		"Updated", stamp(&s.UpdatedAt, now)+" by "+s.UpdatedBy,
	)
	return keyValues(g.stdout, pairs...)
}

// sourceCmd runs one request on a source and prints the source it returns.
func sourceCmd(cmd *cobra.Command, g *globals, method, path string, body any, what string) error {
	c, err := g.client()
	if err != nil {
		return err
	}
	var s sourceView
	raw, err := c.call(cmd.Context(), method, path, nil, body, &s)
	if err != nil {
		return fmt.Errorf("%s: %w", what, err)
	}
	if g.json {
		return printJSON(g.stdout, raw)
	}
	return printSource(g, s)
}

func newSourcesShowCmd(g *globals) *cobra.Command {
	return &cobra.Command{
		Use:   "show SOURCE",
		Short: "Show one source's gate",
		Args:  args(1, "SOURCE"),
		RunE: func(cmd *cobra.Command, a []string) error {
			return sourceCmd(cmd, g, "GET", "/v1/sources/"+seg(a[0]), nil, "show source "+a[0])
		},
	}
}

func newSourcesSetCmd(g *globals) *cobra.Command {
	var limit int
	var window string
	var types []string
	var noLimit bool
	cmd := &cobra.Command{
		Use:   "set SOURCE",
		Short: "Set a source's rate limit and allowed types (replaces both; a pause stays)",
		Example: `  retryd sources set shop --rate-limit 100 --window 1m
  retryd sources set shop --rate-limit 5 --window 1s --allowed-types order.created,order.paid
  retryd sources set shop --no-limit`,
		Args: args(1, "SOURCE"),
		RunE: func(cmd *cobra.Command, a []string) error {
			body := map[string]any{}
			switch {
			case noLimit && (limit != 0 || window != ""):
				return usageErrorf(cmd, "--no-limit cannot be combined with --rate-limit or --window")
			case noLimit:
			case cmd.Flags().Changed("rate-limit") && limit <= 0:
				return usageErrorf(cmd, "--rate-limit %d: the events admitted per window must be 1 or more (--no-limit removes the limit)", limit)
			case limit == 0 || window == "":
				return usageErrorf(cmd, "give --rate-limit N and --window DURATION together, or --no-limit")
			default:
				d, err := time.ParseDuration(window)
				if err != nil || d <= 0 {
					return usageErrorf(cmd, "--window %q is not a duration such as 1s or 1m", window)
				}
				body["rate_limit"] = limit
				body["rate_window"] = window
			}
			if len(types) > 0 {
				body["allowed_types"] = types
			}
			return sourceCmd(cmd, g, "PUT", "/v1/sources/"+seg(a[0]), body, "set source "+a[0])
		},
	}
	f := cmd.Flags()
	f.IntVar(&limit, "rate-limit", 0, "events admitted per window")
	f.StringVar(&window, "window", "", "rate window, a duration such as 1s or 1m")
	f.BoolVar(&noLimit, "no-limit", false, "remove the rate limit")
	f.StringSliceVar(&types, "allowed-types", nil, "event types the source may send (default any)")
	return cmd
}

func newSourcesPauseCmd(g *globals) *cobra.Command {
	var until, reason string
	cmd := &cobra.Command{
		Use:   "pause SOURCE",
		Short: "Pause a source: its events are held (not dropped, no retry used) until resumed or --until",
		Example: `  retryd sources pause shop --reason "partner maintenance"
  retryd sources pause shop --until 30m`,
		Args: args(1, "SOURCE"),
		RunE: func(cmd *cobra.Command, a []string) error {
			body := map[string]any{}
			if until != "" {
				t, err := parseUntil(until, time.Now())
				if err != nil {
					return usageErrorf(cmd, "--until: %v", err)
				}
				body["until"] = t
			}
			if reason != "" {
				body["reason"] = reason
			}
			return sourceCmd(cmd, g, "POST", "/v1/sources/"+seg(a[0])+"/pause", body, "pause source "+a[0])
		},
	}
	cmd.Flags().StringVar(&until, "until", "", "end of the pause: RFC 3339 time or a duration from now such as 30m (default: until resumed)")
	cmd.Flags().StringVar(&reason, "reason", "", "why (shown to operators)")
	return cmd
}

// parseUntil reads an RFC 3339 time or a duration ahead of now.
func parseUntil(v string, now time.Time) (time.Time, error) {
	if t, err := time.Parse(time.RFC3339Nano, v); err == nil {
		return t, nil
	}
	if d, err := time.ParseDuration(v); err == nil && d > 0 {
		return now.Add(d).UTC().Truncate(time.Millisecond), nil
	}
	return time.Time{}, fmt.Errorf("%q is neither an RFC 3339 time nor a duration such as 30m", v)
}

func newSourcesResumeCmd(g *globals) *cobra.Command {
	return &cobra.Command{
		Use:   "resume SOURCE",
		Short: "Resume a paused source: its held events are released at once, in arrival order",
		Args:  args(1, "SOURCE"),
		RunE: func(cmd *cobra.Command, a []string) error {
			return sourceCmd(cmd, g, "POST", "/v1/sources/"+seg(a[0])+"/resume", nil, "resume source "+a[0])
		},
	}
}
