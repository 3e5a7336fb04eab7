package main

import (
	"encoding/json"
	"fmt"
	"net/http"
	"time"

	"github.com/spf13/cobra"

	"github.com/retryd/retryd/pkg/contract"
)

// The schedules commands work the jobs API's periodic schedules
// (/v1/schedules): JetStream message schedules on the SCHEDULES stream,
// which fire a job every tick. `jobs enqueue` posts one job, now or at a
// time (POST /v1/jobs).

// jobFields are the flags of a job that enqueue and schedules create
// share, and the body fields they set.
type jobFields struct {
	payload, priority, timeout string
	maxRetries                 int
}

func (f *jobFields) register(cmd *cobra.Command) {
	cmd.Flags().StringVar(&f.payload, "payload", "", "the job's payload, a JSON value")
	cmd.Flags().StringVar(&f.priority, "priority", "", "high, normal or low")
	cmd.Flags().IntVar(&f.maxRetries, "max-retries", -1, "override the policy's max retries for this job")
	cmd.Flags().StringVar(&f.timeout, "timeout", "", "the handler's timeout, e.g. 30s")
}

func (f *jobFields) body(cmd *cobra.Command) (map[string]any, error) {
	body := map[string]any{}
	if f.payload != "" {
		if !json.Valid([]byte(f.payload)) {
			return nil, usageErrorf(cmd, "--payload is not valid JSON")
		}
		body["payload"] = json.RawMessage(f.payload)
	}
	if f.priority != "" {
		p, err := contract.ParsePriority("--priority", f.priority)
		if err != nil {
			return nil, usageErrorf(cmd, "--priority must be high, normal or low, got %q", f.priority)
		}
		body["priority"] = p
	}
	if f.maxRetries >= 0 {
		body["max_retries"] = f.maxRetries
	}
	if f.timeout != "" {
		d, err := time.ParseDuration(f.timeout)
		if err != nil || d <= 0 {
			return nil, usageErrorf(cmd, "--timeout must be a positive duration such as 30s, got %q", f.timeout)
		}
		body["timeout_ms"] = d.Milliseconds()
	}
	return body, nil
}

func newSchedulesCmd(g *globals) *cobra.Command {
	cmd := group(&cobra.Command{
		Use:     "schedules",
		Aliases: []string{"schedule"},
		Short:   "Periodic jobs: JetStream message schedules that fire a job every tick",
	})
	cmd.AddCommand(newSchedulesListCmd(g), newSchedulesShowCmd(g), newSchedulesCreateCmd(g), newSchedulesDeleteCmd(g))
	return cmd
}

func schedulePath(jobType, name string) string {
	return "/v1/schedules/" + seg(jobType) + "/" + seg(name)
}

func newSchedulesListCmd(g *globals) *cobra.Command {
	return &cobra.Command{
		Use:   "list",
		Short: "List the periodic schedules",
		Args:  args(0),
		RunE: func(cmd *cobra.Command, _ []string) error {
			var l scheduleList
			if done, err := g.fetch(cmd, "/v1/schedules", nil, &l, doing("list schedules")); done {
				return err
			}
			if len(l.Schedules) == 0 {
				_, err := fmt.Fprintln(g.stdout, "No schedule. Create one with `retryd schedules create JOB_TYPE NAME --every 1m`.")
				return err
			}
			t := newTable(g.stdout, "JOB TYPE", "NAME", "PATTERN", "TIME ZONE", "PRIORITY", "UPDATED")
			for _, s := range l.Schedules {
				t.row(s.JobType, s.Name, s.Pattern, s.TimeZone, string(s.Priority), s.UpdatedAt.Local().Format(time.DateTime))
			}
			return t.flush()
		},
	}
}

func newSchedulesShowCmd(g *globals) *cobra.Command {
	return &cobra.Command{
		Use:   "show JOB_TYPE NAME",
		Short: "Show one periodic schedule and the job it fires",
		Args:  args(2, "JOB_TYPE", "NAME"),
		RunE: func(cmd *cobra.Command, a []string) error {
			var s scheduleView
			if done, err := g.fetch(cmd, schedulePath(a[0], a[1]), nil, &s, doing("show schedule "+a[0]+"/"+a[1])); done {
				return err
			}
			return showSchedule(g, s)
		},
	}
}

func showSchedule(g *globals, s scheduleView) error {
	retries := "policy"
	if s.MaxRetries != nil {
		retries = fmt.Sprint(*s.MaxRetries)
	}
	return keyValues(g.stdout,
		"schedule", s.JobType+"/"+s.Name, "pattern", s.Pattern, "time zone", s.TimeZone,
		"job ids", s.JobID+"-<sequence>", "priority", string(s.Priority), "max retries", retries,
		"payload", string(s.Payload), "updated", s.UpdatedAt.Local().Format(time.RFC3339))
}

func newSchedulesCreateCmd(g *globals) *cobra.Command {
	var (
		every, cron, tz string
		job             jobFields
	)
	cmd := &cobra.Command{
		Use:   "create JOB_TYPE NAME",
		Short: "Create or replace a periodic schedule (--every or --cron)",
		Long: `Create or replace a periodic schedule. JetStream fires it: every tick
publishes one job of JOB_TYPE, whose id is "sched-NAME-<sequence>", to
the workers. --every takes a duration of at least 1s; --cron six fields,
seconds first, or @hourly, @daily, @weekly, @monthly, @yearly.`,
		Example: `  retryd schedules create heartbeat every-minute --every 1m
  retryd schedules create report nightly --cron "0 30 2 * * *" --time-zone Europe/Paris --payload '{"scope":"all"}'`,
		Args: args(2, "JOB_TYPE", "NAME"),
		RunE: func(cmd *cobra.Command, a []string) error {
			if (every == "") == (cron == "") {
				return usageErrorf(cmd, "give --every or --cron, one of them")
			}
			body, err := job.body(cmd)
			if err != nil {
				return err
			}
			for k, v := range map[string]string{"every": every, "cron": cron, "time_zone": tz} {
				if v != "" {
					body[k] = v
				}
			}
			var s scheduleView
			if done, err := g.request(cmd, http.MethodPut, schedulePath(a[0], a[1]), nil, body, &s, doing("create schedule "+a[0]+"/"+a[1])); done {
				return err
			}
			fmt.Fprintf(g.stdout, "Schedule %s/%s stored: %s.\n", s.JobType, s.Name, s.Pattern)
			return nil
		},
	}
	cmd.Flags().StringVar(&every, "every", "", "fire every DURATION (at least 1s)")
	cmd.Flags().StringVar(&cron, "cron", "", "fire on a cron expression with seconds, e.g. \"0 */5 * * * *\"")
	cmd.Flags().StringVar(&tz, "time-zone", "", "IANA time zone of --cron (default UTC)")
	job.register(cmd)
	return cmd
}

func newSchedulesDeleteCmd(g *globals) *cobra.Command {
	return &cobra.Command{
		Use:   "delete JOB_TYPE NAME",
		Short: "Delete a periodic schedule: it fires no more",
		Args:  args(2, "JOB_TYPE", "NAME"),
		RunE: func(cmd *cobra.Command, a []string) error {
			c, err := g.client()
			if err != nil {
				return err
			}
			if _, err := c.call(cmd.Context(), http.MethodDelete, schedulePath(a[0], a[1]), nil, nil, nil); err != nil {
				return idErr("delete schedule", a[0]+"/"+a[1], err)
			}
			if g.json {
				return writeJSON(g.stdout, map[string]any{"job_type": a[0], "name": a[1], "deleted": true})
			}
			_, err = fmt.Fprintf(g.stdout, "Schedule %s/%s deleted.\n", a[0], a[1])
			return err
		},
	}
}
