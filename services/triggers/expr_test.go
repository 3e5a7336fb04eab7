package triggers

import (
	"context"
	"encoding/json"
	"strings"
	"testing"
	"time"

	"github.com/stretchr/testify/require"

	"github.com/retryd/retryd/pkg/contract"
)

func testEnvelope(t *testing.T, data string) contract.Envelope {
	t.Helper()
	env := contract.Envelope{
		SpecVersion: contract.SpecVersion, ID: "01JEVENT", Source: "billing", Type: "invoice.paid",
		Time: time.Date(2026, 3, 1, 12, 0, 0, 0, time.UTC), Subject: "inv-7",
	}
	if data != "" {
		env.Data = json.RawMessage(data)
	}
	return env
}

func testActivation(t *testing.T, data string) activation {
	t.Helper()
	act, err := newActivation(testEnvelope(t, data))
	require.NoError(t, err)
	return act
}

func TestPredicates(t *testing.T) {
	t.Parallel()
	x, err := newExprEnv(DefaultCostLimit)
	require.NoError(t, err)
	data := `{"amount": 250, "currency": "EUR", "tags": ["vip", "eu"], "customer": {"id": "c-1", "tier": 2}, "flag": true}`
	cases := []struct {
		expr string
		want bool
	}{
		{`data.amount > 100`, true},
		{`data.amount > 100.5 && data.currency == "EUR"`, true},
		{`data.amount == 250`, true},
		{`"vip" in data.tags`, true},
		{`data.tags.exists(t, t == "us")`, false},
		{`data.customer.tier >= 3`, false},
		{`has(data.coupon)`, false},
		{`has(data.coupon) ? data.coupon != "" : true`, true},
		{`event.source == "billing" && event.type.startsWith("invoice.")`, true},
		{`event.subject == "inv-7" && event.id == "01JEVENT"`, true},
		{`event.time > timestamp("2026-01-01T00:00:00Z")`, true},
		{`data.currency.lowerAscii() == "eur"`, true},
		{`data.flag == true`, true},
		{`data.tags.join(", ") == "vip, eu"`, true},
		{`data.tags.join() == "vipeu"`, true},
		{`data.currency.split("U").size() == 2`, true},
	}
	act := testActivation(t, data)
	for _, c := range cases {
		prg, err := x.compilePredicate(c.expr)
		require.NoError(t, err, c.expr)
		got, err := evalBool(context.Background(), prg, act)
		require.NoError(t, err, c.expr)
		require.Equal(t, c.want, got, c.expr)
	}
}

func TestPredicateCompileErrors(t *testing.T) {
	t.Parallel()
	x, err := newExprEnv(DefaultCostLimit)
	require.NoError(t, err)
	cases := map[string]string{
		`data.amount >`:              "is not a valid CEL expression",
		`data.amount + 1`:            "must return bool, but returns int",
		`data.amount`:                "must return bool, but returns dyn",
		`"yes"`:                      "must return bool, but returns string",
		`data.flag`:                  "data.flag == true",
		`unknown_var == 1`:           "undeclared reference",
		`size(data.tags) == "x" + 1`: "is not a valid CEL expression",
		strings.Repeat("a", 5000):    "more than the limit",
		// Results far larger than the event, allocated before CEL counts
		// their cost: refused when the trigger is saved.
		`data.s.replace("a", data.s).size() > 0`:                         "uses replace()",
		`"%s%s%s%s".format([data.s, data.s, data.s, data.s]).size() > 0`: "uses format()",
		`data.tags.join(data.s).size() > 0`:                              "not a string literal of at most 8 bytes",
		`data.tags.join("` + strings.Repeat("-", 9) + `") == ""`:         "not a string literal of at most 8 bytes",
	}
	for expr, want := range cases {
		_, err := x.compilePredicate(expr)
		require.Error(t, err, expr)
		require.ErrorIs(t, err, contract.ErrInvalid, expr)
		var fe *contract.FieldError
		require.ErrorAs(t, err, &fe)
		require.Equal(t, "predicate", fe.Field)
		require.Contains(t, err.Error(), want, expr)
	}
}

func TestPredicateRuntimeErrorsAndCostLimit(t *testing.T) {
	t.Parallel()
	x, err := newExprEnv(200)
	require.NoError(t, err)
	prg, err := x.compilePredicate(`data.missing.deeper == 1`)
	require.NoError(t, err)
	_, err = evalBool(context.Background(), prg, testActivation(t, `{"a": 1}`))
	require.ErrorContains(t, err, "no such key")

	prg, err = x.compilePredicate(`data.items.all(i, data.items.all(j, i + j >= 0))`)
	require.NoError(t, err)
	items := make([]int, 100)
	raw, err := json.Marshal(map[string]any{"items": items})
	require.NoError(t, err)
	_, err = evalBool(context.Background(), prg, testActivation(t, string(raw)))
	require.ErrorContains(t, err, "cost limit")

	prg, err = x.compilePredicate(`data == null`)
	require.NoError(t, err)
	ok, err := evalBool(context.Background(), prg, testActivation(t, ""))
	require.NoError(t, err)
	require.True(t, ok, "an event without data has data == null")
}

func TestThrottleKeys(t *testing.T) {
	t.Parallel()
	x, err := newExprEnv(DefaultCostLimit)
	require.NoError(t, err)
	act := testActivation(t, `{"customer_id": "c-42", "n": 7, "ratio": 0.5, "ok": true, "obj": {"a": 1}, "long": "`+strings.Repeat("x", 200)+`"}`)
	cases := map[string]string{
		`data.customer_id`:                      "c-42",
		`data.n`:                                "7",
		`int(data.n)`:                           "7",
		`data.ratio`:                            "0.5",
		`data.ok`:                               "true",
		`event.source + "/" + data.customer_id`: "billing/c-42",
	}
	for expr, want := range cases {
		prg, err := x.compileKey(expr)
		require.NoError(t, err, expr)
		got, err := evalKey(context.Background(), prg, act)
		require.NoError(t, err, expr)
		require.Equal(t, want, got, expr)
	}

	prg, err := x.compileKey(`data.long`)
	require.NoError(t, err)
	got, err := evalKey(context.Background(), prg, act)
	require.NoError(t, err)
	require.True(t, strings.HasPrefix(got, "sha256:"), got)
	require.Len(t, got, len("sha256:")+64)

	prg, err = x.compileKey(`data.obj`)
	require.NoError(t, err)
	_, err = evalKey(context.Background(), prg, act)
	require.ErrorContains(t, err, "not a string or number")

	_, err = x.compileKey(`[1, 2]`)
	require.ErrorContains(t, err, "throttle.key must return string")
}
