package main

import (
	"fmt"
	"strconv"
	"strings"
	"time"

	"github.com/spf13/cobra"
)

func newAnalyticsCmd(g *globals) *cobra.Command {
	var jobType, kind, since, until string
	var days, top int
	cmd := &cobra.Command{
		Use:   "analytics",
		Short: "Retry analytics: every kind's outcomes, and per job type success rates, attempts to success, common errors",
		Example: `  retryd analytics
  retryd analytics --job-type send_email --days 30
  retryd analytics --kind event --since 2h`,
		Args: args(0),
		RunE: func(cmd *cobra.Command, _ []string) error {
			q := filterQuery(map[string]string{"job_type": jobType, "kind": kind})
			if err := timeFlags(cmd, since, until, func(name string, t time.Time) { q.Set(name, t.UTC().Format(time.RFC3339Nano)) }); err != nil {
				return err
			}
			if cmd.Flags().Changed("days") {
				if since != "" {
					return usageErrorf(cmd, "--days and --since go separately")
				}
				q.Set("days", strconv.Itoa(days))
			}
			if top > 0 {
				q.Set("top", strconv.Itoa(top))
			}
			var a analyticsView
			if done, err := g.fetch(cmd, "/v1/analytics/retries", q, &a, doing("retry analytics")); done {
				return err
			}
			return printAnalytics(g, a)
		},
	}
	f := cmd.Flags()
	f.StringVar(&jobType, "job-type", "", "one job type (default all)")
	f.StringVar(&kind, "kind", "", "one kind of retried work: job, event, event-trigger, run or a custom kind (default all)")
	f.IntVar(&days, "days", 7, "period: this many days back from now")
	f.StringVar(&since, "since", "", "period start: RFC 3339 or a duration back from now such as 2h")
	f.StringVar(&until, "until", "", "period end: RFC 3339 or a duration back from now")
	f.IntVar(&top, "top", 0, "how many error patterns per job type (server default)")
	return cmd
}

// counts joins the non-zero counts of by in the order of keys: "failed
// 3, completed 2".
func counts[K ~string](keys []string, by map[K]int64) string {
	var out []string
	for _, k := range keys {
		if n := by[K(k)]; n > 0 {
			out = append(out, fmt.Sprintf("%s %d", k, n))
		}
	}
	return strings.Join(out, ", ")
}

func printAnalytics(g *globals, a analyticsView) error {
	w := g.stdout
	fmt.Fprintf(w, "Retried work first failing %s to %s\n", a.Since.Local().Format(time.RFC3339), a.Until.Local().Format(time.RFC3339))
	if a.Partial && a.CompleteFrom != nil {
		fmt.Fprintf(w, "Partial: retention removed what is older than %s; before it only what was kept is counted.\n",
			a.CompleteFrom.Local().Format(time.RFC3339))
	}
	fmt.Fprintln(w)
	if len(a.Kinds) == 0 {
		fmt.Fprintln(w, "Nothing was retried in this period.")
	} else {
		t := newTable(w, "KIND", "ITEMS", "SUCCEEDED", "EXHAUSTED", "SUCCESS RATE", "RETRIES", "RETRIED ITEMS", "STATES", "ERRORS BY CLASS")
		for _, k := range a.Kinds {
			var classes []string
			for _, e := range k.ErrorsByClass {
				classes = append(classes, fmt.Sprintf("%s %d", e.Class, e.Count))
			}
			t.row(k.Kind, itoa(k.Items), itoa(k.Succeeded), itoa(k.Exhausted), percent(k.SuccessRate),
				itoa(k.TotalRetries), itoa(k.RetriedItems), counts(retryStates, k.ByState), strings.Join(classes, ", "))
		}
		if err := t.flush(); err != nil {
			return err
		}
	}
	return printJobAnalytics(g, a)
}

func printJobAnalytics(g *globals, a analyticsView) error {
	w := g.stdout
	fmt.Fprintf(w, "\nJobs created %s to %s\n\n", a.Since.Local().Format(time.RFC3339), a.Until.Local().Format(time.RFC3339))
	if len(a.JobTypes) == 0 {
		fmt.Fprintln(w, "No jobs in this period.")
		return nil
	}
	t := newTable(w, "JOB TYPE", "JOBS", "SUCCEEDED", "FAILED", "SUCCESS RATE", "AVG ATTEMPTS TO SUCCESS", "RETRIES", "RETRIED JOBS", "RETRY SUCCESS", "P50 TO SUCCESS", "P90 TO SUCCESS")
	for _, ta := range a.JobTypes {
		avg := ""
		if ta.AvgAttemptsToSuccess != nil {
			avg = strconv.FormatFloat(*ta.AvgAttemptsToSuccess, 'f', 2, 64)
		}
		t.row(ta.JobType, itoa(ta.TotalJobs), itoa(ta.Succeeded), itoa(ta.Failed), percent(ta.SuccessRate), avg,
			itoa(ta.TotalRetries), itoa(ta.RetriedJobs), percent(ta.RetrySuccessRate),
			msPtr(ta.TimeToSuccessMS.P50), msPtr(ta.TimeToSuccessMS.P90))
	}
	if err := t.flush(); err != nil {
		return err
	}

	fmt.Fprintln(w, "\nStatus and retries per job")
	t = newTable(w, "JOB TYPE", "STATUS", "RETRY DISTRIBUTION (retries: jobs)")
	for _, ta := range a.JobTypes {
		var dist []string
		for _, b := range ta.RetryDistribution {
			dist = append(dist, fmt.Sprintf("%d: %d", b.Retries, b.Jobs))
		}
		t.row(ta.JobType, counts(jobStatuses, ta.ByStatus), strings.Join(dist, ", "))
	}
	if err := t.flush(); err != nil {
		return err
	}

	fmt.Fprintln(w, "\nErrors by class")
	t = newTable(w, "JOB TYPE", "CLASS", "FAILURES")
	n := 0
	for _, ta := range a.JobTypes {
		for _, e := range ta.ErrorsByClass {
			t.row(ta.JobType, e.Class, itoa(e.Count))
			n++
		}
	}
	if n == 0 {
		fmt.Fprintln(w, "  (no failures)")
		return nil
	}
	if err := t.flush(); err != nil {
		return err
	}

	fmt.Fprintln(w, "\nMost common errors")
	t = newTable(w, "JOB TYPE", "CLASS", "COUNT", "PATTERN")
	for _, ta := range a.JobTypes {
		for _, e := range ta.TopErrors {
			t.row(ta.JobType, e.Class, itoa(e.Count), trunc(e.Pattern, 90))
		}
	}
	return t.flush()
}

func itoa(n int64) string { return strconv.FormatInt(n, 10) }

func msPtr(ms *float64) string {
	if ms == nil {
		return ""
	}
	return msDuration(int64(*ms))
}
