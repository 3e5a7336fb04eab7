package main

import (
	"fmt"
	"maps"
	"slices"
	"strconv"
	"time"

	"github.com/spf13/cobra"

	"github.com/retryd/retryd/pkg/backoff"
	"github.com/retryd/retryd/pkg/errclass"
	"github.com/retryd/retryd/pkg/policy"
)

func newSimulateCmd(g *globals) *cobra.Command {
	var kind, jobType, class string
	var retries int
	var pf policyFlags
	cmd := &cobra.Command{
		Use:   "simulate",
		Short: "Show the delay schedule a policy gives, with jitter bounds",
		Long: `simulate prints when each retry of an item would run if every attempt
failed at once: the exponential delay, its bounds once jitter is drawn,
and the time since the first failure.

With --kind (and --job-type) it reads the policy that governs those items
from the API (the job type's, else the kind's default, else the fallback);
the backoff flags then change it. Without --kind it simulates an ad-hoc
policy made of the flags (defaults: 1s base, x2, 5m cap, additive jitter
up to 1s, 5 retries) and needs no server.

A policy with a backoff per error class (class_backoff, --class-backoff)
shows the schedule of each such class after the policy's own; --class
shows one class only.`,
		Example: `  retryd simulate --kind job --job-type send_email
  retryd simulate --base-delay 2h --multiplier 2 --max-delay 24h --jitter additive --jitter-max 5m --max-retries 5
  retryd simulate --kind event --max-delay 1m --retries 10
  retryd simulate --class-backoff '{"rate_limit":{"base_delay_ms":60000,"max_delay_ms":3600000},"timeout":{"first_delay_ms":0}}'
  retryd simulate --kind job --job-type send_email --class timeout`,
		Args: args(0),
		RunE: func(cmd *cobra.Command, _ []string) error {
			if jobType != "" && kind == "" {
				return usageErrorf(cmd, "--job-type needs --kind")
			}
			p := policy.Policy{Name: "ad-hoc", Version: 1, MaxRetries: 5, Backoff: backoff.Default(), Enabled: true}
			source := "ad-hoc policy"
			if kind != "" {
				var err error
				if p, source, err = effectivePolicy(cmd, g, kind, jobType); err != nil {
					return err
				}
			}
			if err := pf.apply(cmd, &p); err != nil {
				return err
			}
			// Only the backoff is simulated: the policy's kind, classes and
			// switch do not change it, and need not be valid here.
			pol := policy.Policy{
				Kind: "simulate", Name: p.Name, Version: max(p.Version, 1), MaxRetries: p.MaxRetries, Enabled: true,
				Backoff: p.Backoff, ClassBackoff: p.ClassBackoff,
			}
			if err := pol.Validate(); err != nil {
				return usageErrorf(cmd, "the policy to simulate is not valid: %v", err)
			}
			n := p.MaxRetries
			if cmd.Flags().Changed("retries") {
				if retries < 0 || retries > policy.MaxSimulatedRetries {
					return usageErrorf(cmd, "--retries must be between 0 and %d", policy.MaxSimulatedRetries)
				}
				n = retries
			}
			if class != "" {
				cl, err := errclass.Parse(class)
				if err != nil {
					return usageErrorf(cmd, "--class: %v", err)
				}
				steps := policy.SimulateClass(pol, cl, n)
				source += ", errors of class " + string(cl)
				if g.json {
					return writeJSON(g.stdout, simulation(source, steps))
				}
				return printSimulation(g, p, source, steps)
			}
			out := simulation(source, policy.Simulate(pol, n))
			classes := slices.Sorted(maps.Keys(pol.ClassBackoff))
			for _, c := range classes {
				if out.Classes == nil {
					out.Classes = map[string][]simulatedStep{}
				}
				out.Classes[string(c)] = simulation(source, policy.SimulateClass(pol, c, n)).Steps
			}
			if g.json {
				return writeJSON(g.stdout, out)
			}
			if err := printSimulation(g, p, source, policy.Simulate(pol, n)); err != nil {
				return err
			}
			for _, c := range classes {
				fmt.Fprintf(g.stdout, "\nErrors of class %s (their own backoff):\n\n", c)
				if err := printSteps(g, policy.SimulateClass(pol, c, n)); err != nil {
					return err
				}
			}
			return nil
		},
	}
	cmd.Flags().StringVar(&kind, "kind", "", "read the policy of this kind from the API")
	cmd.Flags().StringVar(&jobType, "job-type", "", "and this job type")
	cmd.Flags().StringVar(&class, "class", "", "show the schedule of errors of this class only")
	cmd.Flags().IntVar(&retries, "retries", 0, "how many retries to show (default the policy's max retries)")
	pf.register(cmd, false)
	return cmd
}

// effectivePolicy is the policy that governs kind/jobType: the exact one,
// else the kind's default, else the fallback "*".
func effectivePolicy(cmd *cobra.Command, g *globals, kind, jobType string) (policy.Policy, string, error) {
	c, err := g.client()
	if err != nil {
		return policy.Policy{}, "", err
	}
	candidates := [][2]string{{kind, jobType}, {kind, ""}, {"*", ""}}
	if jobType == "" {
		candidates = candidates[1:]
	}
	for _, cand := range candidates {
		var p policy.Policy
		_, err := c.get(cmd.Context(), policyPath(cand[0], cand[1]), nil, &p)
		if isNotFound(err) {
			continue
		}
		if err != nil {
			return policy.Policy{}, "", fmt.Errorf("read policy %s: %w", policyName(cand[0], cand[1]), err)
		}
		return p, fmt.Sprintf("policy %s (%s v%d)", policyName(cand[0], cand[1]), p.Name, p.Version), nil
	}
	return policy.Policy{}, "", fmt.Errorf("no policy governs %s: not even the fallback */_", policyName(kind, jobType))
}

type simulatedStep struct {
	Retry           int   `json:"retry"`
	Attempt         int   `json:"attempt"`
	BaseDelayMS     int64 `json:"base_delay_ms"`
	MinDelayMS      int64 `json:"min_delay_ms"`
	MaxDelayMS      int64 `json:"max_delay_ms"`
	CumulativeMinMS int64 `json:"cumulative_min_ms"`
	CumulativeMaxMS int64 `json:"cumulative_max_ms"`
}

type simulationOut struct {
	Policy string          `json:"policy"`
	Steps  []simulatedStep `json:"steps"`
	// Classes are the schedules of the classes with their own backoff.
	Classes map[string][]simulatedStep `json:"classes,omitempty"`
}

func simulation(source string, steps []policy.Step) simulationOut {
	out := simulationOut{Policy: source, Steps: make([]simulatedStep, len(steps))}
	for i, s := range steps {
		out.Steps[i] = simulatedStep{
			Retry: s.Retry, Attempt: s.Attempt, BaseDelayMS: s.BaseDelay.Milliseconds(),
			MinDelayMS: s.MinDelay.Milliseconds(), MaxDelayMS: s.MaxDelay.Milliseconds(),
			CumulativeMinMS: s.CumulativeMin.Milliseconds(), CumulativeMaxMS: s.CumulativeMax.Milliseconds(),
		}
	}
	return out
}

func printSimulation(g *globals, p policy.Policy, source string, steps []policy.Step) error {
	fmt.Fprintf(g.stdout, "%s: %d retries, %s x%g capped at %s, jitter %s\n\n", source, p.MaxRetries,
		duration(p.Backoff.Base), p.Backoff.Multiplier, duration(p.Backoff.Max), jitter(p.Backoff))
	if err := printSteps(g, steps); err != nil {
		return err
	}
	if !p.Enabled {
		fmt.Fprintln(g.stdout, "\nNote: this policy is disabled; items it governs are not retried.")
	}
	return nil
}

func printSteps(g *globals, steps []policy.Step) error {
	if len(steps) == 0 {
		fmt.Fprintln(g.stdout, "No retries: the first failure is final.")
		return nil
	}
	t := newTable(g.stdout, "RETRY", "ATTEMPT", "BASE DELAY", "DELAY (MIN..MAX)", "SINCE FIRST FAILURE (MIN..MAX)")
	for _, s := range steps {
		t.row(strconv.Itoa(s.Retry), strconv.Itoa(s.Attempt), shortDuration(s.BaseDelay),
			span(s.MinDelay, s.MaxDelay), span(s.CumulativeMin, s.CumulativeMax))
	}
	return t.flush()
}

func span(lo, hi time.Duration) string {
	if lo == hi {
		return shortDuration(lo)
	}
	return shortDuration(lo) + " .. " + shortDuration(hi)
}
