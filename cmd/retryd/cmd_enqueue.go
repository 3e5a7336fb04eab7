package main

import (
	"fmt"
	"net/http"
	"time"

	"github.com/spf13/cobra"
)

func newJobsEnqueueCmd(g *globals) *cobra.Command {
	var (
		id, key, runAt, in, uniqueFor string
		job                           jobFields
	)
	cmd := &cobra.Command{
		Use:   "enqueue JOB_TYPE",
		Short: "Enqueue a job through the jobs API, now or later",
		Long: `Enqueue a job (POST /v1/jobs). --idempotency-key names the job from a
key of yours, so running the command again enqueues nothing new; --id
names it directly. --run-at or --in delays its first run (a JetStream
message schedule fires it); --unique-for keeps its id unique for longer
than the streams' 2-minute duplicate window.`,
		Example: `  retryd jobs enqueue send_email --payload '{"to":"a@example.com"}'
  retryd jobs enqueue report --idempotency-key report-2024-05-01 --in 10m
  retryd jobs enqueue invoice --id inv-42 --run-at 2030-01-01T09:00:00Z --unique-for 24h`,
		Args: args(1, "JOB_TYPE"),
		RunE: func(cmd *cobra.Command, a []string) error {
			body, err := job.body(cmd)
			if err != nil {
				return err
			}
			body["job_type"] = a[0]
			if id != "" {
				body["id"] = id
			}
			if uniqueFor != "" {
				body["unique_for"] = uniqueFor
			}
			switch {
			case runAt != "" && in != "":
				return usageErrorf(cmd, "give --run-at or --in, not both")
			case runAt != "":
				t, err := time.Parse(time.RFC3339Nano, runAt)
				if err != nil {
					return usageErrorf(cmd, "--run-at must be an RFC 3339 time such as 2030-01-01T09:00:00Z, got %q", runAt)
				}
				body["run_at"] = t
			case in != "":
				d, err := time.ParseDuration(in)
				if err != nil || d <= 0 {
					return usageErrorf(cmd, "--in must be a positive duration such as 10m, got %q", in)
				}
				body["run_at"] = time.Now().Add(d).UTC()
			}
			c, err := g.client()
			if err != nil {
				return err
			}
			if key != "" {
				c.header = http.Header{"Idempotency-Key": {key}}
			}
			var out enqueued
			raw, err := c.post(cmd.Context(), "/v1/jobs", body, &out)
			if err != nil {
				return fmt.Errorf("enqueue %s job: %w", a[0], err)
			}
			if g.json {
				return printJSON(g.stdout, raw)
			}
			what := "enqueued on " + out.Subject
			if out.RunAt != nil {
				what = "to run at " + out.RunAt.Local().Format(time.RFC3339)
			}
			if out.Duplicate {
				what = "already enqueued: nothing new"
			}
			_, err = fmt.Fprintf(g.stdout, "Job %s (%s) %s.\n", out.ID, out.JobType, what)
			return err
		},
	}
	cmd.Flags().StringVar(&id, "id", "", "the job's id (default: from --idempotency-key, else a new ULID)")
	cmd.Flags().StringVar(&key, "idempotency-key", "", "a key of yours that names the job: the same key enqueues once")
	cmd.Flags().StringVar(&runAt, "run-at", "", "first run at this RFC 3339 time")
	cmd.Flags().StringVar(&in, "in", "", "first run after this duration, e.g. 10m")
	cmd.Flags().StringVar(&uniqueFor, "unique-for", "", "refuse another job with this id for this long, e.g. 24h")
	job.register(cmd)
	return cmd
}
