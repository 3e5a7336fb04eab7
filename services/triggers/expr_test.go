package triggers

import (
	"context"
	"encoding/json"
	"fmt"
	"math"
	"runtime"
	"strings"
	"testing"
	"time"

	"cel.dev/cel-go/cel"
	"cel.dev/cel-go/common/types"
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
		{`data.tags.exists(a, data.tags.exists(b, data.tags.exists(c, a + b + c == "vipeuvip")))`, true},
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
		// Each level's variable doubles the string of the level around it
		// (issue 41): 18 levels made 256 MiB of a 1 KB event, and the
		// parser takes 40.
		doublingPredicate(18): "nests comprehensions (all, exists, exists_one, map, filter) 18 deep, more than the limit of 3",
		doublingPredicate(40): "40 deep, more than the limit of 3",
		`data.a.exists(a, data.b.exists(b, data.c.exists(c, data.d.exists(d, a == d))))`: "4 deep, more than the limit of 3",
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

// doublingPredicate is the predicate of issue 41 with n levels: each
// level's variable is twice the string of the level around it.
func doublingPredicate(n int) string {
	var b strings.Builder
	b.WriteString("[data.s + data.s].exists(v1, ")
	for i := 2; i <= n; i++ {
		fmt.Fprintf(&b, "[v%d + v%d].exists(v%d, ", i-1, i-1, i)
	}
	fmt.Fprintf(&b, "size(v%d) > 0%s", n, strings.Repeat(")", n))
	return b.String()
}

// programUnchecked plans src with the run-time limits only, as a stored
// expression that compile would refuse is planned by an older version.
func programUnchecked(t *testing.T, x *exprEnv, src string) cel.Program {
	t.Helper()
	ast, iss := x.env.Compile(src)
	require.NoError(t, iss.Err(), src)
	prg, err := x.env.Program(ast, append(x.programOptions(), cel.MemoryTracking())...)
	require.NoError(t, err, src)
	return prg
}

// The run-time limits stop what gets past the checks at definition: the
// doubling predicate, planned without them, fails with an error naming the
// limit it reached, and the largest value it made stays within twice
// MaxValueBytes (the tracked peak, in CEL's units of 10 bytes).
func TestEvaluationAllocatesWithinTheLimits(t *testing.T) {
	t.Parallel()
	kb := `"` + strings.Repeat("x", 1000) + `"`
	byCost, err := newExprEnv(DefaultCostLimit)
	require.NoError(t, err)
	bySize, err := newExprEnv(math.MaxUint64)
	require.NoError(t, err)
	cases := []struct {
		name string
		x    *exprEnv
		src  string
		data string
		want string
		// shared: the values are lists of references to one string, which
		// CEL's memory tracker counts once per reference.
		shared bool
	}{
		{"18 levels, cost", byCost, doublingPredicate(18), `{"s": ` + kb + `}`, "cost limit exceeded", false},
		{"40 levels, cost", byCost, doublingPredicate(40), `{"s": ` + kb + `}`, "cost limit exceeded", false},
		{"18 levels, size", bySize, doublingPredicate(18), `{"s": ` + kb + `}`, "more than the limit of 1048576 bytes", false},
		{"40 levels, size", bySize, doublingPredicate(40), `{"s": ` + kb + `}`, "more than the limit of 1048576 bytes", false},
		{"four long strings", byCost, `size(data.s + data.s + data.s + data.s) > 0`,
			`{"s": "` + strings.Repeat("x", 500_000) + `"}`, "cost limit exceeded", false},
		{"quoted", bySize, `size(strings.quote(strings.quote(strings.quote(data.s)))) > 0`,
			`{"s": "` + strings.Repeat(`\n`, 300_000) + `"}`, "strings.quote() made a value of 1500014 bytes, more than the limit of 1048576 bytes", false},
		// A list of 2^18 references to one string, joined.
		{"doubled list joined", bySize, strings.Replace(strings.Replace(doublingPredicate(18),
			"[data.s + data.s]", "[[data.s] + [data.s]]", 1), "size(v18) > 0", "v18.join().size() > 0", 1),
			`{"s": ` + kb + `}`, "join() would make more than the limit of 1048576 bytes", true},
		{"doubled list", bySize, strings.Replace(doublingPredicate(20), "[data.s + data.s]", "[[data.s] + [data.s]]", 1),
			`{"s": ` + kb + `}`, "list of 524288 elements, more than the limit of 262144", true},
		{"split joined", bySize, `data.s.split("").join().size() > 0`, `{"s": "` + strings.Repeat("x", 300_000) + `"}`,
			"join() of a list of 300000 elements, more than the limit of 262144", true},
		{"mapped list joined", byCost, `data.items.map(i, data.s).join(",").size() > 0`,
			`{"s": ` + kb + `, "items": [` + strings.Repeat("0,", 2000) + `0]}`, "join() would make more than the limit of 1048576 bytes", true},
	}
	for _, c := range cases {
		prg := programUnchecked(t, c.x, c.src)
		var before, after runtime.MemStats
		runtime.ReadMemStats(&before)
		_, det, err := prg.ContextEval(context.Background(), testActivation(t, c.data).vars)
		runtime.ReadMemStats(&after)
		require.ErrorContains(t, err, c.want, c.name)
		peak := det.PeakMemory()
		require.NotNil(t, peak, c.name)
		if !c.shared {
			require.LessOrEqual(t, *peak, uint32(2*MaxValueBytes/10), c.name)
		}
		// Shared with the tests running alongside, so only logged.
		t.Logf("%s: peak %d units, %d bytes allocated in the process", c.name, *peak, after.TotalAlloc-before.TotalAlloc)
	}
}

// `+` costs what it makes: CEL charged one unit for a `+` of strings from
// data (dyn), whatever their size.
func TestConcatenationCostsItsSize(t *testing.T) {
	t.Parallel()
	x, err := newExprEnv(math.MaxUint64)
	require.NoError(t, err)
	prg := programUnchecked(t, x, `size(data.a + data.b) > 0`)
	s := strings.Repeat("x", 100_000)
	ok, det, err := prg.ContextEval(context.Background(), testActivation(t, `{"a": "`+s+`", "b": "`+s+`"}`).vars)
	require.NoError(t, err)
	require.Equal(t, types.True, ok)
	require.GreaterOrEqual(t, *det.ActualCost(), uint64(200_000/concatBytesPerUnit))
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
