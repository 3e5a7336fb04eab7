package main

import (
	"fmt"
	"strconv"
	"strings"
	"time"

	"github.com/spf13/cobra"

	"github.com/retryd/retryd/pkg/backoff"
	"github.com/retryd/retryd/pkg/errclass"
	"github.com/retryd/retryd/pkg/policy"
)

func newPoliciesCmd(g *globals) *cobra.Command {
	cmd := group(&cobra.Command{
		Use:     "policies",
		Aliases: []string{"policy"},
		Short:   "Retry policies per kind and job type",
		Long: `Retry policies per kind and job type. The policy of an item is its
(kind, job type) policy, else the kind's default (job type "_"), else the
fallback kind "*".`,
	})
	cmd.AddCommand(newPoliciesListCmd(g), newPoliciesGetCmd(g), newPoliciesSetCmd(g), newPoliciesVersionsCmd(g))
	return cmd
}

// policyPath is /v1/policies/{kind}/{job_type}; "_" is the kind's default.
func policyPath(kind, jobType string) string {
	if jobType == "" {
		jobType = "_"
	}
	return "/v1/policies/" + seg(kind) + "/" + seg(jobType)
}

func policyArgs(a []string) (kind, jobType string) {
	kind = a[0]
	if len(a) > 1 && a[1] != "_" && a[1] != "default" {
		jobType = a[1]
	}
	return kind, jobType
}

func newPoliciesListCmd(g *globals) *cobra.Command {
	return &cobra.Command{
		Use:   "list",
		Short: "List every policy",
		Args:  args(0),
		RunE: func(cmd *cobra.Command, _ []string) error {
			var res policyList
			if done, err := g.fetch(cmd, "/v1/policies", nil, &res, doing("list policies")); done {
				return err
			}
			t := newTable(g.stdout, "KIND", "JOB TYPE", "NAME", "VERSION", "MAX RETRIES", "BASE", "MULTIPLIER", "MAX", "JITTER", "ENABLED")
			for _, p := range res.Policies {
				jt := p.JobType
				if jt == "" {
					jt = "_"
				}
				t.row(p.Kind, jt, p.Name, strconv.Itoa(p.Version), strconv.Itoa(p.MaxRetries), duration(p.Backoff.Base),
					strconv.FormatFloat(p.Backoff.Multiplier, 'g', -1, 64), duration(p.Backoff.Max), jitter(p.Backoff), strconv.FormatBool(p.Enabled))
			}
			return t.flush()
		},
	}
}

func jitter(b backoff.Config) string {
	if b.Jitter == backoff.JitterAdditive {
		return "+0.." + duration(b.JitterMax)
	}
	return string(b.Jitter)
}

// duration is d as the API holds it, in whole milliseconds.
func duration(d time.Duration) string { return msDuration(d.Milliseconds()) }

// classNames is classes as the API names them.
func classNames(classes []errclass.Class) []string {
	out := make([]string, len(classes))
	for i, c := range classes {
		out[i] = string(c)
	}
	return out
}

func printPolicy(g *globals, p policy.Policy) error {
	jt := p.JobType
	if jt == "" {
		jt = "_ (the kind's default)"
	}
	return keyValues(g.stdout,
		"Kind", p.Kind,
		"Job type", jt,
		"Name", p.Name,
		"Version", strconv.Itoa(p.Version),
		"Enabled", strconv.FormatBool(p.Enabled),
		"Max retries", strconv.Itoa(p.MaxRetries),
		"Backoff", fmt.Sprintf("%s x%g, capped at %s", duration(p.Backoff.Base), p.Backoff.Multiplier, duration(p.Backoff.Max)),
		"Jitter", jitter(p.Backoff),
		"Class backoff", describeClassBackoff(p),
		"Max hold", duration(p.MaxHold)+" (a throttled, paused or waiting item is exhausted as hold_expired after it; holds use no retry)",
		"Max retry-after", duration(p.MaxRetryAfter)+" (a failure's own retry-after hint is honoured up to it)",
		"Retryable classes", joinOr(classNames(p.RetryableClasses), "(class defaults)"),
		"Non-retryable classes", joinOr(classNames(p.NonRetryableClasses), "(class defaults)"),
		"Updated", stamp(&p.UpdatedAt, time.Now())+" by "+p.UpdatedBy,
	)
}

func newPoliciesGetCmd(g *globals) *cobra.Command {
	return &cobra.Command{
		Use:   "get KIND [JOB_TYPE]",
		Short: "Show one policy (JOB_TYPE _ or left out: the kind's default)",
		Example: `  retryd policies get job send_email
  retryd policies get event`,
		Args: args(1, "KIND", "JOB_TYPE"),
		RunE: func(cmd *cobra.Command, a []string) error {
			kind, jobType := policyArgs(a)
			var p policy.Policy
			if done, err := g.fetch(cmd, policyPath(kind, jobType), nil, &p, doing("get policy "+policyName(kind, jobType))); done {
				return err
			}
			return printPolicy(g, p)
		},
	}
}

func policyName(kind, jobType string) string {
	if jobType == "" {
		return kind + "/_"
	}
	return kind + "/" + jobType
}

func newPoliciesVersionsCmd(g *globals) *cobra.Command {
	return &cobra.Command{
		Use:   "versions KIND [JOB_TYPE]",
		Short: "Show every version of a policy",
		Args:  args(1, "KIND", "JOB_TYPE"),
		RunE: func(cmd *cobra.Command, a []string) error {
			kind, jobType := policyArgs(a)
			var res policyVersionList
			if done, err := g.fetch(cmd, policyPath(kind, jobType)+"/versions", nil, &res, doing("policy versions "+policyName(kind, jobType))); done {
				return err
			}
			t := newTable(g.stdout, "VERSION", "CHANGED", "BY", "POLICY")
			for _, v := range res.Versions {
				t.row(strconv.Itoa(v.Version), v.ChangedAt.Local().Format(time.RFC3339), v.ChangedBy, trunc(string(v.Policy), 120))
			}
			return t.flush()
		},
	}
}

// policyFlags are the flags of `policies set` and of the ad-hoc policy of
// `simulate`.
type policyFlags struct {
	maxRetries    int
	baseDelay     time.Duration
	maxDelay      time.Duration
	multiplier    float64
	jitter        string
	jitterMax     time.Duration
	retryable     []string
	nonRetryable  []string
	enabled       bool
	maxHold       time.Duration
	maxRetryAfter time.Duration
	classBackoff  string
	name          string
	by            string
	flagsSet      func(name string) bool
	withClassFlag bool
}

func (pf *policyFlags) register(cmd *cobra.Command, full bool) {
	f := cmd.Flags()
	f.IntVar(&pf.maxRetries, "max-retries", 0, "retries allowed (attempts = max retries + 1)")
	f.DurationVar(&pf.baseDelay, "base-delay", 0, "delay before the first retry, e.g. 1s")
	f.DurationVar(&pf.maxDelay, "max-delay", 0, "cap of the exponential delay, e.g. 5m")
	f.Float64Var(&pf.multiplier, "multiplier", 0, "growth factor per retry (>= 1)")
	f.StringVar(&pf.jitter, "jitter", "", "jitter mode: none, full, equal or additive")
	f.DurationVar(&pf.jitterMax, "jitter-max", 0, "largest additive jitter, e.g. 1s")
	f.StringVar(&pf.classBackoff, "class-backoff", "", `backoff per error class, as JSON: '{"rate_limit":{"base_delay_ms":60000,"max_delay_ms":3600000},"timeout":{"first_delay_ms":0}}' ('{}' for none)`)
	if full {
		pf.withClassFlag = true
		f.StringSliceVar(&pf.retryable, "retryable", nil, "classes to retry whatever their default")
		f.StringSliceVar(&pf.nonRetryable, "non-retryable", nil, "classes never to retry")
		f.BoolVar(&pf.enabled, "enabled", true, "retries on (--enabled=false turns them off)")
		f.DurationVar(&pf.maxHold, "max-hold", 0, "how long an item may be held back (throttled, paused, waiting for a slot) before it is exhausted as hold_expired, e.g. 720h")
		f.DurationVar(&pf.maxRetryAfter, "max-retry-after", 0, "longest retry-after hint of a failure that is honoured, e.g. 24h")
		f.StringVar(&pf.name, "name", "", "policy name (default kind-job_type)")
		f.StringVar(&pf.by, "by", "", "ignored: the API records the token's name")
		_ = f.MarkDeprecated("by", "the API records the token's name as updated_by")
	}
	pf.flagsSet = func(name string) bool { return cmd.Flags().Changed(name) }
}

// apply overrides the fields of p whose flags were given; durations in
// whole milliseconds, as the API keeps them.
func (pf *policyFlags) apply(cmd *cobra.Command, p *policy.Policy) error {
	set := pf.flagsSet
	if set("max-retries") {
		if pf.maxRetries < 0 || pf.maxRetries > 1000 {
			return usageErrorf(cmd, "--max-retries must be between 0 and 1000, got %d", pf.maxRetries)
		}
		p.MaxRetries = pf.maxRetries
	}
	if set("base-delay") {
		p.Backoff.Base = pf.baseDelay.Truncate(time.Millisecond)
	}
	if set("max-delay") {
		p.Backoff.Max = pf.maxDelay.Truncate(time.Millisecond)
	}
	if set("multiplier") {
		p.Backoff.Multiplier = pf.multiplier
	}
	if set("jitter") {
		switch pf.jitter {
		case "none", "full", "equal", "additive":
		default:
			return usageErrorf(cmd, "--jitter %q is not none, full, equal or additive", pf.jitter)
		}
		p.Backoff.Jitter = backoff.Jitter(pf.jitter)
	}
	if set("jitter-max") {
		p.Backoff.JitterMax = pf.jitterMax.Truncate(time.Millisecond)
	}
	if set("class-backoff") {
		cb, err := parseClassBackoff(pf.classBackoff)
		if err != nil {
			return usageErrorf(cmd, "--class-backoff: %v", err)
		}
		p.ClassBackoff = policy.ClassBackoffsFromMS(cb)
	}
	if !pf.withClassFlag {
		return nil
	}
	if set("retryable") {
		p.RetryableClasses = classes(pf.retryable)
	}
	if set("non-retryable") {
		p.NonRetryableClasses = classes(pf.nonRetryable)
	}
	if set("enabled") {
		p.Enabled = pf.enabled
	}
	if set("name") {
		p.Name = pf.name
	}
	if set("max-hold") {
		if pf.maxHold < time.Millisecond {
			return usageErrorf(cmd, "--max-hold must be at least 1ms, got %s", pf.maxHold)
		}
		p.MaxHold = pf.maxHold.Truncate(time.Millisecond)
	}
	if set("max-retry-after") {
		if pf.maxRetryAfter < time.Millisecond {
			return usageErrorf(cmd, "--max-retry-after must be at least 1ms, got %s", pf.maxRetryAfter)
		}
		p.MaxRetryAfter = pf.maxRetryAfter.Truncate(time.Millisecond)
	}
	return nil
}

func newPoliciesSetCmd(g *globals) *cobra.Command {
	var pf policyFlags
	cmd := &cobra.Command{
		Use:   "set KIND [JOB_TYPE]",
		Short: "Create or change a policy; flags left out keep their current value",
		Long: `set creates a policy or changes the flags given and keeps the rest. Every
change is a new version; retries decided afterwards use it. A new policy
needs --max-retries, --base-delay and --max-delay.`,
		Example: `  retryd policies set job send_email --max-retries 5 --base-delay 30s --max-delay 10m
  retryd policies set job send_email --non-retryable validation,authentication
  retryd policies set event --enabled=false`,
		Args: args(1, "KIND", "JOB_TYPE"),
		RunE: func(cmd *cobra.Command, a []string) error {
			kind, jobType := policyArgs(a)
			c, err := g.client()
			if err != nil {
				return err
			}
			var cur policy.Policy
			_, err = c.get(cmd.Context(), policyPath(kind, jobType), nil, &cur)
			switch {
			case isNotFound(err):
				for _, name := range []string{"max-retries", "base-delay", "max-delay"} {
					if !pf.flagsSet(name) {
						return usageErrorf(cmd, "policy %s does not exist yet: give --max-retries, --base-delay and --max-delay", policyName(kind, jobType))
					}
				}
				cur = policy.New(kind, jobType)
				cur.Name = strings.TrimSuffix(kind+"-"+jobType, "-")
			case err != nil:
				return fmt.Errorf("read policy %s: %w", policyName(kind, jobType), err)
			}
			if err := pf.apply(cmd, &cur); err != nil {
				return err
			}
			// The policy as read goes back with the flags applied: its
			// version makes the server answer 409 if someone changed it
			// meanwhile (0 for a new one, with 0 hold limits for the
			// defaults), and updated_by names who changes it now ("": the
			// server's default).
			cur.UpdatedBy = pf.by
			var saved policy.Policy
			raw, err := c.put(cmd.Context(), policyPath(kind, jobType), cur, &saved)
			if err != nil {
				return fmt.Errorf("set policy %s: %w", policyName(kind, jobType), err)
			}
			if g.json {
				return printJSON(g.stdout, raw)
			}
			fmt.Fprintf(g.stdout, "Policy %s is now version %d.\n", policyName(kind, jobType), saved.Version)
			return printPolicy(g, saved)
		},
	}
	pf.register(cmd, true)
	return cmd
}

func classes(names []string) []errclass.Class {
	out := make([]errclass.Class, len(names))
	for i, n := range names {
		out[i] = errclass.Class(n)
	}
	return out
}
