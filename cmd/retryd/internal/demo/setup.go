package demo

import (
	"context"
	"errors"
	"fmt"
	"net/http"
	"reflect"
	"slices"
	"time"

	"github.com/retryd/retryd/pkg/backoff"
	"github.com/retryd/retryd/pkg/contract"
	"github.com/retryd/retryd/pkg/errclass"
	"github.com/retryd/retryd/pkg/policy"
)

// Policies are the demo's policies: delays of seconds instead of the
// default policies' minutes and hours, so every path of a retry shows within a minute.
func Policies() []policy.Policy {
	demo := func(kind, jobType, name string, maxRetries int, b backoff.Config) policy.Policy {
		p := policy.New(kind, jobType)
		p.Name, p.MaxRetries, p.Backoff = name, maxRetries, b
		p.NonRetryableClasses = []errclass.Class{errclass.Authentication, errclass.Permission, errclass.Validation}
		p.MaxHold, p.MaxRetryAfter = policy.DefaultMaxHold, policy.DefaultMaxRetryAfter
		return p
	}
	ms := func(n int64) time.Duration { return time.Duration(n) * time.Millisecond }
	return []policy.Policy{
		demo(contract.KindJob, JobSendEmail, "demo-send-email", 3,
			backoff.Config{Base: ms(1000), Multiplier: 2, Max: ms(8000), Jitter: backoff.JitterAdditive, JitterMax: ms(500)}),
		demo(contract.KindJob, JobSyncCRM, "demo-sync-crm", 4,
			backoff.Config{Base: ms(1500), Multiplier: 1.5, Max: ms(10000), Jitter: backoff.JitterEqual}),
		demo(contract.KindJob, JobChargeCard, "demo-charge-card", 2,
			backoff.Config{Base: ms(2000), Multiplier: 2, Max: ms(10000), Jitter: backoff.JitterFull}),
		demo(contract.KindEvent, "", "demo-event-ingress", 20,
			backoff.Config{Base: ms(1000), Multiplier: 1.5, Max: ms(5000), Jitter: backoff.JitterAdditive, JitterMax: ms(300)}),
		demo(contract.KindEventTrigger, "", "demo-event-trigger", 20,
			backoff.Config{Base: ms(800), Multiplier: 1.5, Max: ms(4000), Jitter: backoff.JitterAdditive, JitterMax: ms(300)}),
	}
}

// same reports whether the stored policy cur already is want, but for
// its version and who changed it when, and the order of its classes.
func same(cur, want policy.Policy) bool {
	for _, p := range []*policy.Policy{&cur, &want} {
		p.Version, p.UpdatedBy, p.CreatedAt, p.UpdatedAt = 0, "", time.Time{}, time.Time{}
		p.RetryableClasses = slices.Sorted(slices.Values(p.RetryableClasses))
		p.NonRetryableClasses = slices.Sorted(slices.Values(p.NonRetryableClasses))
	}
	return reflect.DeepEqual(cur, want)
}

func isStatus(err error, status int) bool {
	var se *statusError
	return errors.As(err, &se) && se.status == status
}

func (d *Demo) setup(ctx context.Context) error {
	for _, want := range Policies() {
		path := "/v1/policies/" + want.Kind + "/_"
		if want.JobType != "" {
			path = "/v1/policies/" + want.Kind + "/" + want.JobType
		}
		var cur policy.Policy
		err := d.api.do(ctx, http.MethodGet, path, nil, &cur)
		switch {
		case err == nil && same(cur, want):
			continue // unchanged: no new version on every start
		case err == nil:
			want.Version = cur.Version
		case isStatus(err, http.StatusNotFound):
		default:
			return err
		}
		if err := d.api.do(ctx, http.MethodPut, path, want, nil); err != nil {
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
