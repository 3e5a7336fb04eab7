package main

import (
	"encoding/json"
	"errors"
	"fmt"
	"net/http"
	"net/url"
	"strconv"
	"strings"
	"time"

	"github.com/spf13/cobra"

	"github.com/retryd/retryd/internal/serve"
	"github.com/retryd/retryd/stores/retrystore"
)

func (g *globals) client() (*apiClient, error) {
	c, err := newAPIClient(g.api, g.timeout)
	if err != nil {
		return nil, err
	}
	c.token = g.token
	if c.http.Transport, err = g.transport(); err != nil {
		return nil, err
	}
	return c, nil
}

// fetch GETs path into out for a command that shows it. With --json it
// prints the answer as it came and reports done, as it does on an error
// (the API's passed through fail, which says what the command was
// doing); otherwise the caller prints out its own way.
func (g *globals) fetch(cmd *cobra.Command, path string, q url.Values, out any, fail func(error) error) (done bool, err error) {
	return g.request(cmd, http.MethodGet, path, q, nil, out, fail)
}

// request is fetch (GET) and send (POST): the call, then --json or the
// caller's own printing.
func (g *globals) request(cmd *cobra.Command, method, path string, q url.Values, body, out any, fail func(error) error) (done bool, err error) {
	c, err := g.client()
	if err != nil {
		return true, err
	}
	raw, err := c.call(cmd.Context(), method, path, q, body, out)
	if err != nil {
		return true, fail(err)
	}
	if g.json {
		return true, printJSON(g.stdout, raw)
	}
	return false, nil
}

// doing wraps an error in what the command was doing.
func doing(what string) func(error) error {
	return func(err error) error { return fmt.Errorf("%s: %w", what, err) }
}

// transport is the HTTP transport of the CLI's requests: the default one,
// or one that also trusts --ca-file (a private CA of an https API).
func (g *globals) transport() (http.RoundTripper, error) {
	tlsCfg, err := serve.ClientTLS(g.caFile)
	if err != nil {
		return nil, usageErr(fmt.Errorf("--ca-file: %w", err))
	}
	if tlsCfg == nil {
		return http.DefaultTransport, nil
	}
	t := http.DefaultTransport.(*http.Transport).Clone()
	t.TLSClientConfig = tlsCfg
	return t, nil
}

// retryStates are the states the API filters on.
var retryStates = []string{"scheduled", "due", "succeeded", "exhausted", "cancelled"}

func newRetriesCmd(g *globals) *cobra.Command {
	cmd := group(&cobra.Command{
		Use:     "retries",
		Aliases: []string{"retry"},
		Short:   "List, inspect, cancel and retry retries",
	})
	cmd.AddCommand(newRetriesListCmd(g), newRetriesShowCmd(g), newRetriesCancelCmd(g),
		newRetriesRetryCmd(g), newBulkRetryCmd(g))
	return cmd
}

func newRetriesListCmd(g *globals) *cobra.Command {
	var kind, state, source, jobType string
	var pages *pager
	cmd := &cobra.Command{
		Use:   "list",
		Short: "List retries, filtered by kind, state, source and job type",
		Example: `  retryd retries list --state scheduled
  retryd retries list --kind job --job-type send_email --state exhausted
  retryd retries list --source shop --json`,
		Args: args(0),
		RunE: func(cmd *cobra.Command, _ []string) error {
			if state != "" && !contains(retryStates, state) {
				return usageErrorf(cmd, "--state %q is not one of %s", state, strings.Join(retryStates, ", "))
			}
			q := filterQuery(map[string]string{"kind": kind, "state": state, "source": source, "job_type": jobType})
			return list(cmd, g, pages, q, listing[retryPage, retrystore.Retry]{
				path: "/v1/retries", what: "retries", none: "No retries match.", more: "retries",
				rows:    func(p retryPage) ([]retrystore.Retry, string) { return p.Retries, p.NextCursor },
				page:    func(rows []retrystore.Retry) retryPage { return retryPage{Retries: rows} },
				columns: []string{"KIND", "ID", "STATE", "ATTEMPT", "RETRIES", "NEXT ATTEMPT", "JOB TYPE", "SOURCE", "LAST ERROR"},
				row: func(r retrystore.Retry, now time.Time) []string {
					state, next := string(r.State), ""
					if r.State == "scheduled" || r.State == "due" {
						next = relTime(r.NextAttemptAt, now)
					}
					if h := r.Held; h != nil {
						state, next = heldState(h), holdEnd(h, now)
					}
					return []string{r.Kind, r.ItemID, state, strconv.Itoa(r.Attempt), fmt.Sprintf("%d/%d", r.RetryCount, r.MaxRetries),
						next, r.JobType, r.Source, lastError(r)}
				},
			})
		},
	}
	f := cmd.Flags()
	f.StringVar(&kind, "kind", "", "kind: event, event-trigger, job, run or your own")
	f.StringVar(&state, "state", "", "state: "+strings.Join(retryStates, ", "))
	f.StringVar(&source, "source", "", "event source")
	f.StringVar(&jobType, "job-type", "", "job type")
	pages = addPager(cmd, 1000)
	return cmd
}

// lastError is an item's last error. The last reason of an item held now
// or last (and since admitted, released or exhausted) is its hold's,
// which is no error: a held item's state column shows it.
func lastError(r retrystore.Retry) string {
	switch {
	case r.LastErrorClass == "" && r.LastErrorMessage == "" && (r.Held != nil || r.LastReason == r.HoldReason):
		return ""
	case r.LastErrorClass == "" && r.LastErrorMessage == "":
		return r.LastReason
	case r.LastErrorMessage == "":
		return r.LastErrorClass
	}
	return trunc(r.LastErrorClass+": "+r.LastErrorMessage, 60)
}

// heldState is a held item's state as the list shows it: held, what for
// and under which hold key. The API's state stays scheduled.
func heldState(h *retrystore.Hold) string {
	if h.Key == "" {
		return "held (" + h.Reason + ")"
	}
	return "held (" + h.Reason + ", key " + h.Key + ")"
}

// holdEnd says when a hold ends: its end if known, else that it lasts
// until released, at most for what is left of its max_hold (the time the
// scheduler would otherwise show, which no attempt is waiting for).
func holdEnd(h *retrystore.Hold, now time.Time) string {
	if h.Until != nil {
		return relTime(h.Until, now)
	}
	return "until released (at most " + shortDuration(max(h.MaxHoldAt.Sub(now), 0)) + ")"
}

// itemArgs reads KIND ID, or KIND/ID as one argument.
func itemArgs(cmd *cobra.Command, a []string) (kind, id string, err error) {
	switch {
	case len(a) == 2:
		return a[0], a[1], nil
	case len(a) == 1 && strings.Count(a[0], "/") == 1:
		kind, id, _ = strings.Cut(a[0], "/")
		if kind != "" && id != "" {
			return kind, id, nil
		}
	}
	return "", "", usageErrorf(cmd, "%s takes KIND ID (or KIND/ID), e.g. job 01J9ZX…", cmd.CommandPath())
}

func newRetriesShowCmd(g *globals) *cobra.Command {
	return &cobra.Command{
		Use:   "show KIND ID",
		Short: "Show one retry and its lifecycle: why did it retry?",
		Example: `  retryd retries show job 01J9ZX3K5Q8V2N4M6P7R9S0T1W
  retryd retries show event/order-7781`,
		Args: cobra.ArbitraryArgs,
		RunE: func(cmd *cobra.Command, a []string) error {
			kind, id, err := itemArgs(cmd, a)
			if err != nil {
				return err
			}
			var v retryView
			if done, err := g.fetch(cmd, "/v1/retries/"+seg(kind)+"/"+seg(id), nil, &v, func(err error) error { return itemErr("show retry", kind, id, err) }); done {
				return err
			}
			return printRetry(g, v)
		},
	}
}

func printRetry(g *globals, v retryView) error {
	r, now := v.Retry, time.Now()
	state := string(r.State)
	if r.Held != nil {
		state = "held (state " + state + ": waits on a hold, which uses no retry)"
	}
	pairs := []string{
		"Kind", r.Kind,
		"ID", r.ItemID,
		"State", state,
		"Attempt", strconv.Itoa(r.Attempt),
		"Retries used", retriesUsed(r.RetryCount, r.MaxRetries),
		"Policy", fmt.Sprintf("%s v%d", r.PolicyName, r.PolicyVersion),
	}
	if r.JobType != "" {
		pairs = append(pairs, "Job type", r.JobType)
	}
	if r.Source != "" {
		pairs = append(pairs, "Source", r.Source)
	}
	switch h := r.Held; {
	case h != nil:
		held := h.Reason + " since " + stamp(&h.Since, now)
		if h.Key != "" {
			held += ", hold key " + h.Key
		}
		pairs = append(pairs, "Held", held+" (uses no retry)")
		if h.Until != nil {
			pairs = append(pairs, "Hold ends", stamp(h.Until, now))
		} else {
			pairs = append(pairs, "Hold ends", "until released, at most until "+stamp(&h.MaxHoldAt, now))
			if r.NextAttemptAt != nil && r.NextAttemptAt.Before(h.MaxHoldAt) {
				// A throttle or concurrency hold with no end given: the
				// owner looks at it again then, and may hold it again.
				pairs = append(pairs, "Next check", stamp(r.NextAttemptAt, now))
			}
		}
		pairs = append(pairs, "Max hold", msDuration(h.MaxHoldMS)+" from held since, to "+stamp(&h.MaxHoldAt, now))
	case r.State == "scheduled" || r.State == "due":
		pairs = append(pairs, "Next attempt", stamp(r.NextAttemptAt, now))
	}
	if r.LastErrorClass != "" || r.LastErrorMessage != "" {
		pairs = append(pairs, "Last error", strings.TrimPrefix(r.LastErrorClass+": "+r.LastErrorMessage, ": "))
	}
	if r.LastReason != "" && (r.Held == nil || r.LastReason != r.Held.Reason) {
		pairs = append(pairs, "Last reason", r.LastReason)
	}
	if r.HeldSince != nil && r.Held == nil && r.State == "due" {
		held := r.HoldReason + " since " + stamp(r.HeldSince, now)
		if r.HoldKey != "" {
			held += ", hold key " + r.HoldKey
		}
		pairs = append(pairs, "Held", held+" (uses no retry; due now, its owner looks at it again)")
	}
	if r.ExhaustedReason != "" {
		pairs = append(pairs, "Exhausted", r.ExhaustedReason)
	}
	if !r.RetryEnabled {
		pairs = append(pairs, "Retries", "disabled for this item")
	}
	pairs = append(pairs, "Created", stamp(&r.CreatedAt, now), "Updated", stamp(&r.UpdatedAt, now))
	if err := keyValues(g.stdout, pairs...); err != nil {
		return err
	}
	fmt.Fprintf(g.stdout, "\nLifecycle (%d events; retryd streams view RETRIES --subject 'retry.%s.*.%s'):\n", len(v.History), r.Kind, r.ItemID)
	if len(v.History) == 0 {
		fmt.Fprintln(g.stdout, "  (no history)")
		return nil
	}
	// EXECUTOR is the worker instance that ran the attempt, as its
	// failed, held or succeeded fact said: "-" on the scheduler's rows
	// and for owners that do not say.
	t := newTable(g.stdout, "TIME", "EVENT", "ATTEMPT", "EXECUTOR", "ERROR CLASS", "DECIDED BY", "DELAY", "POLICY", "NEXT ATTEMPT", "DETAIL")
	for _, h := range v.History {
		delay, policy := "", ""
		if h.DelayMS != nil {
			delay = msDuration(*h.DelayMS)
		}
		if h.PolicyName != "" {
			policy = fmt.Sprintf("%s v%d", h.PolicyName, h.PolicyVersion)
		}
		next := ""
		if h.NextAttemptAt != nil {
			next = h.NextAttemptAt.Local().Format("15:04:05.000")
		}
		t.row(h.At.Local().Format("2006-01-02 15:04:05.000"), h.Event, strconv.Itoa(h.Attempt), h.Executor, h.ErrorClass,
			h.DecidedBy, delay, policy, next, trunc(historyDetail(h), 70))
	}
	return t.flush()
}

// historyDetail is the most telling part of an entry: the error message,
// or an operator's note or reason.
func historyDetail(h historyEntry) string {
	if h.ErrorMessage != "" {
		return h.ErrorMessage
	}
	var d map[string]any
	if len(h.Detail) == 0 || json.Unmarshal(h.Detail, &d) != nil {
		return ""
	}
	var parts []string
	// A hold: what held it, and for how long a hold may last.
	if hr, ok := d["hold_reason"].(string); ok && hr != "" {
		parts = append(parts, "held: "+hr)
	}
	for _, k := range []string{"note", "detail", "reason", "by"} {
		if s, ok := d[k].(string); ok && s != "" {
			parts = append(parts, s)
		}
	}
	// A scheduling decision: how the delay was made up.
	if base, ok := d["base_delay_ms"].(float64); ok {
		s := "base " + msDuration(int64(base))
		if j, ok := d["jitter_ms"].(float64); ok && j != 0 {
			s += fmt.Sprintf(", jitter %+dms", int64(j))
		}
		if ra, ok := d["retry_after_ms"].(float64); ok {
			s += ", retry-after " + msDuration(int64(ra))
		}
		if c, ok := d["capped_by"].(string); ok && c != "" {
			s += ", capped by " + c
		}
		parts = append(parts, s)
	}
	if rc, ok := d["retry_count"].(float64); ok {
		if mr, ok := d["max_retries"].(float64); ok {
			parts = append(parts, fmt.Sprintf("retry %d of %d", int(rc), int(mr)))
		}
	}
	return strings.Join(parts, "; ")
}

func newRetriesCancelCmd(g *globals) *cobra.Command {
	var reason, by string
	cmd := &cobra.Command{
		Use:     "cancel KIND ID",
		Short:   "Cancel a pending retry: no due event follows",
		Example: `  retryd retries cancel job 01J9ZX3K5Q8V2N4M6P7R9S0T1W --reason "customer deleted"`,
		Args:    cobra.ArbitraryArgs,
		RunE: func(cmd *cobra.Command, a []string) error {
			kind, id, err := itemArgs(cmd, a)
			if err != nil {
				return err
			}
			return retryAction(cmd, g, kind, id, "cancel", map[string]any{"reason": reason, "by": by})
		},
	}
	cmd.Flags().StringVar(&reason, "reason", "", "why (recorded in the lifecycle)")
	cmd.Flags().StringVar(&by, "by", "", "ignored: the API records the token's name")
	_ = cmd.Flags().MarkDeprecated("by", "the API records the token's name as by")
	return cmd
}

func newRetriesRetryCmd(g *globals) *cobra.Command {
	var reason, by string
	var reset bool
	cmd := &cobra.Command{
		Use:   "retry KIND ID",
		Short: "Retry now, from any state (exhausted and cancelled included)",
		Example: `  retryd retries retry job 01J9ZX3K5Q8V2N4M6P7R9S0T1W --reason "API key rotated"
  retryd retries retry job 01J9ZX3K5Q8V2N4M6P7R9S0T1W --reset-attempts`,
		Args: cobra.ArbitraryArgs,
		RunE: func(cmd *cobra.Command, a []string) error {
			kind, id, err := itemArgs(cmd, a)
			if err != nil {
				return err
			}
			return retryAction(cmd, g, kind, id, "retry", map[string]any{"reason": reason, "by": by, "reset_attempts": reset})
		},
	}
	cmd.Flags().StringVar(&reason, "reason", "", "why (recorded in the lifecycle)")
	cmd.Flags().StringVar(&by, "by", "", "ignored: the API records the token's name")
	_ = cmd.Flags().MarkDeprecated("by", "the API records the token's name as by")
	cmd.Flags().BoolVar(&reset, "reset-attempts", false, "give the item its full retry budget again")
	return cmd
}

func retryAction(cmd *cobra.Command, g *globals, kind, id, action string, body map[string]any) error {
	c, err := g.client()
	if err != nil {
		return err
	}
	for k, v := range body {
		if v == "" {
			delete(body, k)
		}
	}
	var v retryView
	raw, err := c.post(cmd.Context(), "/v1/retries/"+seg(kind)+"/"+seg(id)+"/"+action, body, &v)
	if err != nil {
		return itemErr(action, kind, id, err)
	}
	if g.json {
		return printJSON(g.stdout, raw)
	}
	r := v.Retry
	switch action {
	case "cancel":
		fmt.Fprintf(g.stdout, "Cancelled %s/%s at attempt %d: state %s.\n", r.Kind, r.ItemID, r.Attempt, r.State)
	default:
		fmt.Fprintf(g.stdout, "Retrying %s/%s now: attempt %d, state %s (retries used %s).\n",
			r.Kind, r.ItemID, r.Attempt, r.State, retriesUsed(r.RetryCount, r.MaxRetries))
		if reset, _ := body["reset_attempts"].(bool); !reset && r.RetryCount >= r.MaxRetries {
			fmt.Fprintln(g.stdout, "A failure of this attempt exhausts it; --reset-attempts gives it its whole budget.")
		}
	}
	return nil
}

// retriesUsed says how much of an item's retry budget is used. A manual
// retry without --reset-attempts may go past the budget, and "3 of 2"
// would read as a counting error.
func retriesUsed(used, allowed int) string {
	if used > allowed {
		return fmt.Sprintf("%d, over the %d allowed", used, allowed)
	}
	return fmt.Sprintf("%d of %d", used, allowed)
}

// itemErr names the item in err unless the API's message does already.
func itemErr(what, kind, id string, err error) error {
	var ae *apiError
	if errors.As(err, &ae) && strings.Contains(ae.Message, kind+"/"+id) {
		return err
	}
	return fmt.Errorf("%s %s/%s: %w", what, kind, id, err)
}

func contains(list []string, s string) bool {
	for _, v := range list {
		if v == s {
			return true
		}
	}
	return false
}
