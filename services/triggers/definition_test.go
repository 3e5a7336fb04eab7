package triggers

import (
	"testing"
	"time"

	"github.com/stretchr/testify/require"

	"github.com/retryd/retryd/pkg/contract"
)

func validInput() TriggerInput {
	return TriggerInput{
		Name: "Onboard big invoices", Source: "billing", EventType: "invoice.paid",
		Predicate: `data.amount > 100`, Workflow: "onboard",
		Throttle:       &ThrottleInput{Limit: new(10), Window: "1m", Key: "data.customer_id"},
		MaxConcurrency: new(5),
	}
}

func TestDefinitionValid(t *testing.T) {
	t.Parallel()
	x, err := newExprEnv(DefaultCostLimit)
	require.NoError(t, err)
	d, progs, err := validInput().definition(x, true)
	require.NoError(t, err)
	require.Equal(t, 10, d.ThrottleLimit)
	require.Equal(t, time.Minute, d.ThrottleWindow)
	require.Equal(t, "data.customer_id", d.ThrottleKey)
	require.Equal(t, 5, d.MaxConcurrency)
	require.True(t, d.Enabled)
	require.NotNil(t, progs.predicate)
	require.NotNil(t, progs.key)

	in := validInput()
	in.Predicate, in.Throttle, in.MaxConcurrency, in.Enabled = "", nil, nil, new(false)
	d, progs, err = in.definition(x, true)
	require.NoError(t, err)
	require.Zero(t, d.ThrottleLimit)
	require.Zero(t, d.MaxConcurrency)
	require.False(t, d.Enabled, "an explicit enabled wins over the default")
	require.Nil(t, progs.predicate)
	require.Nil(t, progs.key)
}

func TestDefinitionInvalid(t *testing.T) {
	t.Parallel()
	x, err := newExprEnv(DefaultCostLimit)
	require.NoError(t, err)
	cases := []struct {
		name   string
		change func(*TriggerInput)
		field  string
		reason string
	}{
		{"bad id", func(in *TriggerInput) { in.ID = "a.b" }, "id", "letters, digits"},
		{"no name", func(in *TriggerInput) { in.Name = " " }, "name", "is required"},
		{"control chars", func(in *TriggerInput) { in.Name = "a\x00b" }, "name", "control characters"},
		{"bad source", func(in *TriggerInput) { in.Source = "Bill ing" }, "source", "URI-reference"},
		{"no source", func(in *TriggerInput) { in.Source = "" }, "source", "is required"},
		{"bad type", func(in *TriggerInput) { in.EventType = "invoice..paid" }, "event_type", "dot-separated"},
		{"bad workflow", func(in *TriggerInput) { in.Workflow = "on.board" }, "workflow", "lowercase"},
		{"predicate syntax", func(in *TriggerInput) { in.Predicate = "data.amount >" }, "predicate", "not a valid CEL expression"},
		{"predicate not bool", func(in *TriggerInput) { in.Predicate = "data.amount * 2.0" }, "predicate", "must return bool"},
		{"predicate string", func(in *TriggerInput) { in.Predicate = `"true"` }, "predicate", "returns string"},
		{"negative limit", func(in *TriggerInput) { in.Throttle.Limit = new(-1) }, "throttle.limit", "between 1 and"},
		{"zero limit", func(in *TriggerInput) { in.Throttle.Limit = new(0) }, "throttle.limit", "got 0"},
		{"window without limit", func(in *TriggerInput) { in.Throttle.Limit = nil }, "throttle.limit", "required when throttle.window"},
		{"empty throttle", func(in *TriggerInput) { in.Throttle = &ThrottleInput{} }, "throttle.limit", "is required"},
		{"limit without window", func(in *TriggerInput) { in.Throttle.Window = "" }, "throttle.window", "is required"},
		{"bad window", func(in *TriggerInput) { in.Throttle.Window = "fortnight" }, "throttle.window", "not a duration"},
		{"negative window", func(in *TriggerInput) { in.Throttle.Window = "-1s" }, "throttle.window", "between"},
		{"tiny window", func(in *TriggerInput) { in.Throttle.Window = "1ms" }, "throttle.window", "between"},
		{"huge window", func(in *TriggerInput) { in.Throttle.Window = "48h" }, "throttle.window", "between"},
		{"sub-ms window", func(in *TriggerInput) { in.Throttle.Window = "10500us" }, "throttle.window", "whole number of milliseconds"},
		{"bad key", func(in *TriggerInput) { in.Throttle.Key = "data.customer_id +" }, "throttle.key", "not a valid CEL expression"},
		{"key list", func(in *TriggerInput) { in.Throttle.Key = "[data.customer_id]" }, "throttle.key", "must return"},
		{"zero concurrency", func(in *TriggerInput) { in.MaxConcurrency = new(0) }, "max_concurrency", "leave it out"},
		{"negative concurrency", func(in *TriggerInput) { in.MaxConcurrency = new(-3) }, "max_concurrency", "got -3"},
		{"bad run timeout", func(in *TriggerInput) { in.RunTimeout = "an hour" }, "run_timeout", "not a duration"},
		{"bare number run timeout", func(in *TriggerInput) { in.RunTimeout = "30" }, "run_timeout", "not a duration"},
		{"negative run timeout", func(in *TriggerInput) { in.RunTimeout = "-5m" }, "run_timeout", "between 1s and 168h0m0s"},
		{"tiny run timeout", func(in *TriggerInput) { in.RunTimeout = "999ms" }, "run_timeout", "between"},
		{"huge run timeout", func(in *TriggerInput) { in.RunTimeout = "169h" }, "run_timeout", "between"},
		{"sub-ms run timeout", func(in *TriggerInput) { in.RunTimeout = "1s500us" }, "run_timeout", "whole number of milliseconds"},
	}
	for _, c := range cases {
		in := validInput()
		c.change(&in)
		_, _, err := in.definition(x, true)
		require.Error(t, err, c.name)
		require.ErrorIs(t, err, contract.ErrInvalid, c.name)
		var fe *contract.FieldError
		require.ErrorAs(t, err, &fe, c.name)
		require.Equal(t, c.field, fe.Field, c.name)
		require.Contains(t, err.Error(), c.reason, c.name)
	}
}

// FuzzTriggerInput checks that no definition, however odd, panics the
// validation or yields a definition the database would refuse.
func FuzzTriggerInput(f *testing.F) {
	x, err := newExprEnv(DefaultCostLimit)
	if err != nil {
		f.Fatal(err)
	}
	f.Add("billing", "invoice.paid", "data.amount > 100", 10, "1m", "data.customer_id", 3)
	f.Add("", "", "", 0, "", "", 0)
	f.Add("a", "b.c", "[1,2].all(x, x > 0)", -1, "-5s", "data", -1)
	f.Fuzz(func(t *testing.T, source, typ, predicate string, limit int, window, key string, conc int) {
		in := TriggerInput{Name: "fuzz", Source: source, EventType: typ, Predicate: predicate, Workflow: "w",
			Throttle: &ThrottleInput{Limit: &limit, Window: window, Key: key}, MaxConcurrency: &conc}
		d, _, err := in.definition(x, true)
		if err != nil {
			require.ErrorIs(t, err, contract.ErrInvalid)
			return
		}
		require.Positive(t, d.ThrottleLimit)
		require.GreaterOrEqual(t, d.ThrottleWindow, MinThrottleWindow)
		require.Positive(t, d.MaxConcurrency)
		require.NoError(t, contract.ValidateToken("source", d.Source))
	})
}
