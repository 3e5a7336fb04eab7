package triggers

import (
	"fmt"
	"strings"
	"time"
	"unicode"

	"cel.dev/cel-go/cel"

	"github.com/retryd/retryd/pkg/contract"
	"github.com/retryd/retryd/services/triggers/internal/triggerstore"
)

// Limits on trigger definitions.
const (
	MaxNameLen        = 200
	MaxThrottleLimit  = 1_000_000
	MinThrottleWindow = 10 * time.Millisecond
	MaxThrottleWindow = 24 * time.Hour
	MaxConcurrency    = 100_000
	// A trigger's run timeout: at least a second, because leases are
	// checked by the reconcile pass and renewed by heartbeats, which a
	// shorter lease would outrun; at most a week, the longest a slot may
	// be held by an executor that stopped reporting.
	MinRunTimeout = time.Second
	MaxRunTimeout = 7 * 24 * time.Hour
)

// TriggerInput is the JSON body of POST /v1/triggers and PUT
// /v1/triggers/{id}. PUT replaces the whole definition; Enabled left out
// keeps the trigger's current state (true for a new trigger).
type TriggerInput struct {
	// ID is optional on POST (a ULID is generated) and ignored on PUT
	// unless it differs from the path.
	ID        string `json:"id,omitempty"`
	Name      string `json:"name"`
	Source    string `json:"source"`
	EventType string `json:"event_type"`
	// Predicate is a CEL expression over `event` and `data` that returns
	// bool; empty matches every event.
	Predicate      string         `json:"predicate,omitempty"`
	Throttle       *ThrottleInput `json:"throttle,omitempty"`
	MaxConcurrency *int           `json:"max_concurrency,omitempty"`
	// RunTimeout is a Go duration ("30m", "2h"): how long a run holds its
	// concurrency slot without a heartbeat or its end. Empty is the
	// service's default (RETRYD_TRIGGERS_RUN_TIMEOUT).
	RunTimeout string `json:"run_timeout,omitempty"`
	Workflow   string `json:"workflow"`
	Enabled    *bool  `json:"enabled,omitempty"`
}

// ThrottleInput is at most Limit launches per sliding Window, per value of
// the optional Key expression.
type ThrottleInput struct {
	Limit *int `json:"limit"`
	// Window is a Go duration: "500ms", "30s", "1m", "1h30m".
	Window string `json:"window"`
	Key    string `json:"key,omitempty"`
}

// TriggerView is how the API shows a trigger.
type TriggerView struct {
	ID string `json:"id"`
	DefinitionView
	Version   int       `json:"version"`
	CreatedAt time.Time `json:"created_at"`
	UpdatedAt time.Time `json:"updated_at"`
}

// DefinitionView is a trigger's definition as the API shows it, in a
// trigger (TriggerView) and in each of its versions (VersionView).
type DefinitionView struct {
	Name           string        `json:"name"`
	Source         string        `json:"source"`
	EventType      string        `json:"event_type"`
	Predicate      string        `json:"predicate"`
	Throttle       *ThrottleView `json:"throttle,omitempty"`
	MaxConcurrency int           `json:"max_concurrency,omitempty"`
	// RunTimeout is left out when the trigger uses the service's default.
	RunTimeout   string `json:"run_timeout,omitempty"`
	RunTimeoutMS int64  `json:"run_timeout_ms,omitempty"`
	Workflow     string `json:"workflow"`
	Enabled      bool   `json:"enabled"`
}

// ThrottleView is a trigger's throttle as the API shows it.
type ThrottleView struct {
	Limit    int    `json:"limit"`
	Window   string `json:"window"`
	WindowMS int64  `json:"window_ms"`
	Key      string `json:"key,omitempty"`
}

// VersionView is one entry of GET /v1/triggers/{id}/versions.
type VersionView struct {
	Version int `json:"version"`
	DefinitionView
	Deleted   bool      `json:"deleted,omitempty"`
	CreatedAt time.Time `json:"created_at"`
}

func viewDefinition(d triggerstore.Definition) DefinitionView {
	v := DefinitionView{
		Name: d.Name, Source: d.Source, EventType: d.EventType, Predicate: d.Predicate,
		MaxConcurrency: d.MaxConcurrency, Workflow: d.Workflow, Enabled: d.Enabled,
	}
	if d.ThrottleLimit != 0 {
		v.Throttle = &ThrottleView{Limit: d.ThrottleLimit, Window: d.ThrottleWindow.String(), WindowMS: d.ThrottleWindow.Milliseconds(), Key: d.ThrottleKey}
	}
	// Zero is the service's default: both stay empty.
	if d.RunTimeout != 0 {
		v.RunTimeout, v.RunTimeoutMS = d.RunTimeout.String(), d.RunTimeout.Milliseconds()
	}
	return v
}

func viewTrigger(t triggerstore.Trigger) TriggerView {
	return TriggerView{ID: t.ID, DefinitionView: viewDefinition(t.Definition), Version: t.Version, CreatedAt: t.CreatedAt, UpdatedAt: t.UpdatedAt}
}

func viewVersion(v triggerstore.Version) VersionView {
	return VersionView{Version: v.Version, DefinitionView: viewDefinition(v.Definition), Deleted: v.Deleted, CreatedAt: v.CreatedAt}
}

func invalidField(field, reason string) error {
	return &contract.FieldError{Field: field, Reason: reason, Err: contract.ErrInvalid}
}

// definition validates the input and returns the definition to store
// with its compiled programs. enabled is used when the input leaves
// Enabled out. Errors wrap contract.ErrInvalid and name the field.
func (in TriggerInput) definition(x *exprEnv, enabled bool) (triggerstore.Definition, compiled, error) {
	var progs compiled
	if in.ID != "" {
		if err := contract.ValidateID("id", in.ID); err != nil {
			return triggerstore.Definition{}, progs, err
		}
	}
	if err := validateName(in.Name); err != nil {
		return triggerstore.Definition{}, progs, err
	}
	// A source is a token or any URI-reference; the trigger keeps its key
	// (contract.SourceKey), the token events.<source>.<type> carries.
	if err := contract.ValidateSource("source", in.Source); err != nil {
		return triggerstore.Definition{}, progs, err
	}
	if err := contract.ValidateType("event_type", in.EventType); err != nil {
		return triggerstore.Definition{}, progs, err
	}
	if err := contract.ValidateToken("workflow", in.Workflow); err != nil {
		return triggerstore.Definition{}, progs, err
	}
	d := triggerstore.Definition{
		Name: in.Name, Source: contract.SourceKey(in.Source), EventType: in.EventType,
		Predicate: strings.TrimSpace(in.Predicate), Workflow: in.Workflow, Enabled: enabled,
	}
	if in.Enabled != nil {
		d.Enabled = *in.Enabled
	}
	if d.Predicate != "" {
		prg, err := x.compilePredicate(d.Predicate)
		if err != nil {
			return triggerstore.Definition{}, progs, err
		}
		progs.predicate = prg
	}
	if in.Throttle != nil {
		key, err := in.Throttle.apply(x, &d)
		if err != nil {
			return triggerstore.Definition{}, progs, err
		}
		progs.key = key
	}
	if in.MaxConcurrency != nil {
		n := *in.MaxConcurrency
		if n < 1 || n > MaxConcurrency {
			return triggerstore.Definition{}, progs, invalidField("max_concurrency",
				fmt.Sprintf("must be between 1 and %d, got %d (leave it out for no limit)", MaxConcurrency, n))
		}
		d.MaxConcurrency = n
	}
	if in.RunTimeout != "" {
		rt, err := parseRunTimeout(in.RunTimeout)
		if err != nil {
			return triggerstore.Definition{}, progs, err
		}
		d.RunTimeout = rt
	}
	return d, progs, nil
}

// parseRunTimeout validates a trigger's run_timeout. Whole milliseconds,
// because that is what the store keeps.
func parseRunTimeout(v string) (time.Duration, error) {
	rt, err := time.ParseDuration(v)
	if err != nil {
		return 0, invalidField("run_timeout", fmt.Sprintf(`%q is not a duration such as "30m", "2h" or "90s"`, v))
	}
	if rt < MinRunTimeout || rt > MaxRunTimeout {
		return 0, invalidField("run_timeout", fmt.Sprintf("must be between %s and %s, got %s (leave it out for the service's default)", MinRunTimeout, MaxRunTimeout, rt))
	}
	if rt%time.Millisecond != 0 {
		return 0, invalidField("run_timeout", fmt.Sprintf("must be a whole number of milliseconds, got %s", rt))
	}
	return rt, nil
}

// apply validates the throttle and sets it on d; it returns the compiled
// key expression, nil when there is none.
func (t ThrottleInput) apply(x *exprEnv, d *triggerstore.Definition) (cel.Program, error) {
	if t.Limit == nil {
		if t.Window != "" {
			return nil, invalidField("throttle.limit", "is required when throttle.window is set")
		}
		return nil, invalidField("throttle.limit", "is required (leave throttle out for no throttle)")
	}
	if n := *t.Limit; n < 1 || n > MaxThrottleLimit {
		return nil, invalidField("throttle.limit", fmt.Sprintf("must be between 1 and %d, got %d", MaxThrottleLimit, n))
	}
	if t.Window == "" {
		return nil, invalidField("throttle.window", `is required, a duration such as "30s" or "1m"`)
	}
	w, err := time.ParseDuration(t.Window)
	if err != nil {
		return nil, invalidField("throttle.window", fmt.Sprintf(`%q is not a duration such as "500ms", "30s" or "1m"`, t.Window))
	}
	if w < MinThrottleWindow || w > MaxThrottleWindow {
		return nil, invalidField("throttle.window", fmt.Sprintf("must be between %s and %s, got %s", MinThrottleWindow, MaxThrottleWindow, w))
	}
	if w%time.Millisecond != 0 {
		return nil, invalidField("throttle.window", fmt.Sprintf("must be a whole number of milliseconds, got %s", w))
	}
	d.ThrottleLimit, d.ThrottleWindow = *t.Limit, w
	d.ThrottleKey = strings.TrimSpace(t.Key)
	if d.ThrottleKey == "" {
		return nil, nil
	}
	return x.compileKey(d.ThrottleKey)
}

func validateName(name string) error {
	switch {
	case strings.TrimSpace(name) == "":
		return invalidField("name", "is required")
	case len(name) > MaxNameLen:
		return invalidField("name", fmt.Sprintf("is %d bytes, more than the limit of %d", len(name), MaxNameLen))
	case strings.IndexFunc(name, unicode.IsControl) >= 0:
		return invalidField("name", "must not contain control characters")
	}
	return nil
}
