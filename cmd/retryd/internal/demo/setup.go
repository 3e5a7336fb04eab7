package demo

import (
	"context"
	"errors"
	"fmt"
	"net/http"
	"slices"
)

// policy is a retry policy as the API reads and writes it.
type policy struct {
	Kind                string   `json:"kind,omitempty"`
	JobType             string   `json:"job_type,omitempty"`
	Name                string   `json:"name"`
	Version             int      `json:"version,omitempty"`
	MaxRetries          int      `json:"max_retries"`
	BaseDelayMS         int64    `json:"base_delay_ms"`
	Multiplier          float64  `json:"multiplier"`
	MaxDelayMS          int64    `json:"max_delay_ms"`
	Jitter              string   `json:"jitter"`
	JitterMS            int64    `json:"jitter_ms"`
	RetryableClasses    []string `json:"retryable_classes"`
	NonRetryableClasses []string `json:"non_retryable_classes"`
	Enabled             bool     `json:"enabled"`
}

var nonRetryable = []string{"authentication", "permission", "validation"}

// Policies are the demo's policies: delays of seconds instead of the
// default policies' minutes and hours, so every path of a retry shows within a minute.
func Policies() []policy {
	return []policy{
		{Kind: "job", JobType: JobSendEmail, Name: "demo-send-email", MaxRetries: 3, BaseDelayMS: 1000, Multiplier: 2,
			MaxDelayMS: 8000, Jitter: "additive", JitterMS: 500, NonRetryableClasses: nonRetryable},
		{Kind: "job", JobType: JobSyncCRM, Name: "demo-sync-crm", MaxRetries: 4, BaseDelayMS: 1500, Multiplier: 1.5,
			MaxDelayMS: 10000, Jitter: "equal", NonRetryableClasses: nonRetryable},
		{Kind: "job", JobType: JobChargeCard, Name: "demo-charge-card", MaxRetries: 2, BaseDelayMS: 2000, Multiplier: 2,
			MaxDelayMS: 10000, Jitter: "full", NonRetryableClasses: nonRetryable},
		{Kind: "event", Name: "demo-event-ingress", MaxRetries: 20, BaseDelayMS: 1000, Multiplier: 1.5,
			MaxDelayMS: 5000, Jitter: "additive", JitterMS: 300, NonRetryableClasses: nonRetryable},
		{Kind: "event-trigger", Name: "demo-event-trigger", MaxRetries: 20, BaseDelayMS: 800, Multiplier: 1.5,
			MaxDelayMS: 4000, Jitter: "additive", JitterMS: 300, NonRetryableClasses: nonRetryable},
	}
}

func (p policy) same(o policy) bool {
	return p.Name == o.Name && p.MaxRetries == o.MaxRetries && p.BaseDelayMS == o.BaseDelayMS &&
		p.Multiplier == o.Multiplier && p.MaxDelayMS == o.MaxDelayMS && p.Jitter == o.Jitter &&
		p.JitterMS == o.JitterMS && p.Enabled == o.Enabled &&
		slices.Equal(sorted(p.RetryableClasses), sorted(o.RetryableClasses)) &&
		slices.Equal(sorted(p.NonRetryableClasses), sorted(o.NonRetryableClasses))
}

func sorted(s []string) []string {
	out := append([]string{}, s...)
	slices.Sort(out)
	return out
}

func isStatus(err error, status int) bool {
	var se *statusError
	return errors.As(err, &se) && se.status == status
}

func (d *Demo) setup(ctx context.Context) error {
	for _, want := range Policies() {
		want.Enabled = true
		path := "/v1/policies/" + want.Kind + "/_"
		if want.JobType != "" {
			path = "/v1/policies/" + want.Kind + "/" + want.JobType
		}
		var cur policy
		err := d.api.do(ctx, http.MethodGet, path, nil, &cur)
		switch {
		case err == nil && cur.same(want):
			continue // unchanged: no new version on every start
		case err == nil:
			want.Version = cur.Version
		case isStatus(err, http.StatusNotFound):
		default:
			return err
		}
		if want.RetryableClasses == nil {
			want.RetryableClasses = []string{}
		}
		body := want
		body.Kind, body.JobType = "", ""
		if err := d.api.do(ctx, http.MethodPut, path, body, nil); err != nil {
			return fmt.Errorf("set policy %s: %w", path, err)
		}
	}
	// A rate-limited source (bursts exceed it) and one that is paused now
	// and then: set on the first start only, so a limit an operator
	// changed since is kept.
	for source, body := range map[string]map[string]any{
		SourceShop:    {"rate_limit": 3, "rate_window": "1s"},
		SourcePartner: {},
	} {
		if err := d.setSourceOnce(ctx, source, body); err != nil {
			return err
		}
	}
	trigger := map[string]any{
		"name":            "Fulfil orders over 150",
		"source":          SourceShop,
		"event_type":      "order.created",
		"predicate":       "data.total > 150.0",
		"throttle":        map[string]any{"limit": 2, "window": "1s"},
		"max_concurrency": 3,
		// Short, so a run whose executor died frees its slot quickly; the
		// executor's heartbeats keep its slow runs alive past it.
		"run_timeout": runTimeout.String(),
		"workflow":    Workflow,
	}
	err := d.api.do(ctx, http.MethodPut, "/v1/triggers/"+TriggerID, trigger, nil)
	if isStatus(err, http.StatusNotFound) {
		trigger["id"] = TriggerID
		err = d.api.do(ctx, http.MethodPost, "/v1/triggers", trigger, nil)
	}
	if err != nil {
		return fmt.Errorf("set trigger %s: %w", TriggerID, err)
	}
	return nil
}

// setSourceOnce configures source unless it already has a gate (an
// earlier start, or an operator, set it).
func (d *Demo) setSourceOnce(ctx context.Context, source string, body map[string]any) error {
	err := d.api.do(ctx, http.MethodGet, "/v1/sources/"+source, nil, nil)
	switch {
	case err == nil:
		return nil
	case !isStatus(err, http.StatusNotFound):
		return fmt.Errorf("read source %s: %w", source, err)
	}
	if err := d.api.do(ctx, http.MethodPut, "/v1/sources/"+source, body, nil); err != nil {
		return fmt.Errorf("set source %s: %w", source, err)
	}
	return nil
}
