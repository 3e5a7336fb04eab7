package triggers

import (
	"context"
	"crypto/sha256"
	"encoding/hex"
	"encoding/json"
	"errors"
	"fmt"
	"strconv"
	"strings"

	"cel.dev/cel-go/cel"
	celast "cel.dev/cel-go/common/ast"
	"cel.dev/cel-go/common/operators"
	"cel.dev/cel-go/common/types"
	"cel.dev/cel-go/common/types/ref"
	"cel.dev/cel-go/common/types/traits"
	"cel.dev/cel-go/ext"
	"cel.dev/cel-go/interpreter"

	"github.com/retryd/retryd/pkg/contract"
	"github.com/retryd/retryd/stores/pgtext"
)

// Limits on trigger expressions.
const (
	// MaxExpressionLen bounds a predicate or throttle key expression, in
	// characters.
	MaxExpressionLen = 4096
	// DefaultCostLimit bounds the work one evaluation may do (CEL cost
	// units, roughly one per operation); comprehensions over large lists
	// are what reaches it.
	DefaultCostLimit = 100_000
	// MaxComprehensionDepth bounds how deeply comprehensions (all,
	// exists, exists_one, map, filter) nest in one expression: each level
	// has a variable of its own that can double what the level around it
	// made, so 18 levels made a string of about 256 MB from a 1 kB event.
	MaxComprehensionDepth = 3
	// MaxValueBytes bounds every string or bytes value an evaluation makes
	// (twice the largest event data, contract.MaxDataBytes).
	MaxValueBytes = 2 * contract.MaxDataBytes
	// MaxListLen bounds every list an evaluation makes: about the longest
	// list an event's data can hold ([0,0,...] in contract.MaxDataBytes).
	MaxListLen = contract.MaxDataBytes / 2
	// concatBytesPerUnit is what `+` on strings and bytes charges: one
	// cost unit per this many bytes of its result, as CEL charges it when
	// the checker knows both sides are strings.
	concatBytesPerUnit = 10
	// maxThrottleKeyLen is the longest throttle key stored as is; longer
	// keys are stored as a SHA-256 digest.
	maxThrottleKeyLen = 128
)

// exprEnv is the CEL environment of predicates and throttle keys: `event`
// is the envelope's attributes and `data` the decoded event data.
type exprEnv struct {
	env       *cel.Env
	costLimit uint64
}

func newExprEnv(costLimit uint64) (*exprEnv, error) {
	env, err := cel.NewEnv(
		cel.Variable("event", cel.MapType(cel.StringType, cel.DynType)),
		cel.Variable("data", cel.DynType),
		ext.Strings(),
		boundedJoin(),
		cel.CrossTypeNumericComparisons(true),
		cel.ParserExpressionSizeLimit(MaxExpressionLen),
		cel.ParserRecursionLimit(64),
	)
	if err != nil {
		return nil, fmt.Errorf("create CEL environment: %w", err)
	}
	return &exprEnv{env: env, costLimit: costLimit}, nil
}

// compile parses and type-checks an expression whose result must be one
// of want (cel.DynType accepts anything that may turn out right at run
// time). Errors name field and carry CEL's message with the position.
func (e *exprEnv) compile(field, src, hint string, want ...*cel.Type) (cel.Program, error) {
	if len(src) > MaxExpressionLen {
		return nil, invalidField(field, fmt.Sprintf("is %d characters, more than the limit of %d", len(src), MaxExpressionLen))
	}
	ast, iss := e.env.Compile(src)
	if iss != nil && iss.Err() != nil {
		return nil, invalidField(field, "is not a valid CEL expression: "+strings.TrimSpace(iss.Err().Error()))
	}
	if err := boundedAllocation(ast); err != nil {
		return nil, invalidField(field, err.Error())
	}
	if err := boundedNesting(ast); err != nil {
		return nil, invalidField(field, err.Error())
	}
	out := ast.OutputType()
	ok := false
	for _, w := range want {
		if out.IsExactType(w) {
			ok = true
		}
	}
	if !ok {
		names := make([]string, len(want))
		for i, w := range want {
			names[i] = w.String()
		}
		return nil, invalidField(field, fmt.Sprintf("must return %s, but returns %s%s", strings.Join(names, " or "), out, hint))
	}
	prg, err := e.env.Program(ast, e.programOptions()...)
	if err != nil {
		return nil, invalidField(field, "cannot be planned: "+err.Error())
	}
	return prg, nil
}

// programOptions are the run-time limits of every evaluation: the cost
// limit, with `+` charged by the size of what it makes, and the size
// limits of allocationGuard. They do not rely on compile's checks: what
// gets past those is still bounded.
func (e *exprEnv) programOptions() []cel.ProgramOption {
	return []cel.ProgramOption{
		cel.CostLimit(e.costLimit),
		cel.CostTracking(allocationGuard{}),
		cel.InterruptCheckFrequency(64),
		cel.EvalOptions(cel.OptOptimize),
	}
}

// maxJoinSeparator is the longest separator join() may use.
const maxJoinSeparator = 8

// boundedAllocation refuses the string functions whose one call can make a
// result far larger than the event they read. CEL charges a call's cost
// from the size of its result, that is, after allocating it: the cost limit
// cannot stop `data.s.replace("a", data.s)` (a 30 kB string became 858 MiB)
// or `"%s%s%s%s".format([data.s, data.s, data.s, data.s])`. What a call of
// the others makes can still add up (`+` of `+`, join() of a long list):
// allocationGuard bounds that at run time.
func boundedAllocation(checked *cel.Ast) error {
	nav := celast.NavigateAST(checked.NativeRep())
	for _, call := range celast.MatchDescendants(nav, func(e celast.NavigableExpr) bool { return e.Kind() == celast.CallKind }) {
		c := call.AsCall()
		switch c.FunctionName() {
		case "replace":
			return errors.New("uses replace(), which trigger expressions do not allow: its result can be far larger than the event " +
				"(a string replaced by itself), and CEL counts that cost only after allocating it")
		case "format":
			return errors.New("uses format(), which trigger expressions do not allow: one call can repeat the event's largest " +
				"string as many times as it has clauses, and CEL counts that cost only after allocating it")
		case "join":
			args := c.Args()
			if len(args) == 0 {
				continue
			}
			sep, ok := literalString(args[0])
			if !ok || len(sep) > maxJoinSeparator {
				return fmt.Errorf("joins with a separator that is not a string literal of at most %d bytes: a long separator "+
					"between many items makes a result far larger than the event", maxJoinSeparator)
			}
		}
	}
	return nil
}

// boundedNesting refuses comprehensions nested deeper than
// MaxComprehensionDepth. The run-time limits stop such an expression too;
// this says why when the trigger is saved, instead of filtering every
// delivery with predicate_error.
func boundedNesting(checked *cel.Ast) error {
	nav := celast.NavigateAST(checked.NativeRep())
	deepest := 0
	for _, c := range celast.MatchDescendants(nav, celast.KindMatcher(celast.ComprehensionKind)) {
		depth := 1
		for p, ok := c.Parent(); ok; p, ok = p.Parent() {
			if p.Kind() == celast.ComprehensionKind {
				depth++
			}
		}
		deepest = max(deepest, depth)
	}
	if deepest > MaxComprehensionDepth {
		return fmt.Errorf("nests comprehensions (all, exists, exists_one, map, filter) %d deep, more than the limit of %d: "+
			"each level can double the strings and lists of the one around it", deepest, MaxComprehensionDepth)
	}
	return nil
}

// allocationGuard is the run-time bound on what an evaluation allocates.
// CEL calls it after each call it has no cost model of its own for, which
// includes every `+`: it charges `+` on strings and bytes by the size of
// the result (CEL charged 1 unit when an operand came from `data`, whose
// type it knows only per event, so four 500 kB strings cost 13 units), and
// it stops the evaluation at a string or bytes value over MaxValueBytes or
// a list over MaxListLen. A call makes at most twice its largest operand
// (`+`), so what one step allocates past the limits stays bounded; join(),
// which can make far more, checks before it allocates (boundedJoin).
type allocationGuard struct{}

func (allocationGuard) CallCost(function, _ string, _ []ref.Val, result ref.Val) *uint64 {
	var n int
	switch v := result.(type) {
	case types.String:
		n = len(v)
	case types.Bytes:
		n = len(v)
	case traits.Lister:
		if size, ok := v.Size().(types.Int); ok && size > MaxListLen {
			stopAtLimit("%s made a list of %d elements, more than the limit of %d", callName(function), size, MaxListLen)
		}
		return nil
	default:
		return nil
	}
	if n > MaxValueBytes {
		stopAtLimit("%s made a value of %d bytes, more than the limit of %d bytes", callName(function), n, MaxValueBytes)
	}
	if function != operators.Add {
		return nil
	}
	cost := uint64(1 + n/concatBytesPerUnit)
	return &cost
}

// stopAtLimit ends the evaluation the way CEL ends one at its own limits.
// The message names sizes and limits only, never the event's values.
func stopAtLimit(format string, args ...any) {
	panic(interpreter.EvalCancelledError{Cause: interpreter.MemoryLimitExceeded,
		Message: "operation cancelled: " + fmt.Sprintf(format, args...)})
}

// callName is a function as it is written: `+` for _+_, size() for size.
func callName(function string) string {
	if op, ok := operators.FindReverse(function); ok {
		return "`" + op + "`"
	}
	return function + "()"
}

// boundedJoin replaces the bindings of the strings extension's join() with
// ones that add up the result's size before allocating it: a list can be
// far larger than its memory (`l + l` shares l) and each element can be a
// string of the event, so the result can be far larger than anything
// allocationGuard saw. It stops the evaluation as allocationGuard does,
// rather than return an error value that `||` or exists() could pass over.
func boundedJoin() cel.EnvOption {
	strList := []*cel.Type{cel.ListType(cel.StringType)}
	return cel.Function("join",
		cel.MemberOverload("list_join", strList, cel.StringType,
			cel.UnaryBinding(func(list ref.Val) ref.Val { return joinBounded(list, "") })),
		cel.MemberOverload("list_join_string", append(strList, cel.StringType), cel.StringType,
			cel.BinaryBinding(func(list, sep ref.Val) ref.Val {
				s, ok := sep.(types.String)
				if !ok {
					return types.MaybeNoSuchOverloadErr(sep)
				}
				return joinBounded(list, string(s))
			})))
}

func joinBounded(list ref.Val, sep string) ref.Val {
	l, ok := list.(traits.Lister)
	if !ok {
		return types.MaybeNoSuchOverloadErr(list)
	}
	n, ok := l.Size().(types.Int)
	if !ok {
		return types.MaybeNoSuchOverloadErr(list)
	}
	if n > MaxListLen {
		stopAtLimit("join() of a list of %d elements, more than the limit of %d", n, MaxListLen)
	}
	total := 0
	for i := range n {
		s, ok := l.Get(i).(types.String)
		if !ok {
			return types.NewErr("join: element %d is not a string", i)
		}
		if i > 0 {
			total += len(sep)
		}
		if total += len(s); total > MaxValueBytes {
			stopAtLimit("join() would make more than the limit of %d bytes", MaxValueBytes)
		}
	}
	var b strings.Builder
	b.Grow(total)
	for i := range n {
		if i > 0 {
			b.WriteString(sep)
		}
		b.WriteString(string(l.Get(i).(types.String)))
	}
	return types.String(b.String())
}

func literalString(e celast.Expr) (string, bool) {
	if e.Kind() != celast.LiteralKind {
		return "", false
	}
	s, ok := e.AsLiteral().(types.String)
	return string(s), ok
}

// compilePredicate compiles a predicate; it must return bool. A predicate
// returning dyn (such as `data.flag`) is refused: whether it is a bool is
// only known per event, and a trigger that silently filters everything is
// worse than an error when saving it.
func (e *exprEnv) compilePredicate(src string) (cel.Program, error) {
	return e.compile("predicate", src, " (compare values to get a bool, e.g. data.flag == true)", cel.BoolType)
}

// compileKey compiles a throttle key: a string, or a scalar turned into
// one; dyn (such as `data.customer_id`) is checked per event.
func (e *exprEnv) compileKey(src string) (cel.Program, error) {
	return e.compile("throttle.key", src, "", cel.StringType, cel.IntType, cel.UintType, cel.DoubleType, cel.BoolType, cel.DynType)
}

// activation is what expressions see of one event.
type activation struct {
	vars map[string]any
}

// newActivation builds the variables of an event. Data is decoded as
// JSON, so numbers are doubles (as in google.protobuf.Struct); an event
// without data has `data == null`.
func newActivation(env contract.Envelope) (activation, error) {
	var data any
	if len(env.Data) > 0 {
		if err := json.Unmarshal(env.Data, &data); err != nil {
			return activation{}, fmt.Errorf("decode event data: %w", err)
		}
	}
	ext := env.Extensions
	if ext == nil {
		ext = map[string]any{}
	}
	return activation{vars: map[string]any{
		"event": map[string]any{
			"id":      env.ID,
			"source":  env.Source,
			"type":    env.Type,
			"time":    env.Time,
			"subject": env.Subject,
			// The event's CloudEvents extension attributes, by name:
			// event.extensions.partitionkey.
			"extensions": ext,
		},
		"data": data,
	}}, nil
}

// evalBool runs a predicate. Evaluation errors (a missing field, the cost
// limit) are returned; the caller filters the delivery with a reason.
func evalBool(ctx context.Context, prg cel.Program, act activation) (bool, error) {
	out, _, err := prg.ContextEval(ctx, act.vars)
	if err != nil {
		return false, fmt.Errorf("evaluate predicate: %w", err)
	}
	b, ok := out.(types.Bool)
	if !ok {
		return false, fmt.Errorf("evaluate predicate: returned %s, not bool", out.Type())
	}
	return bool(b), nil
}

// evalKey runs a throttle key expression and turns its value into the
// stored key: strings as they are, numbers and bools formatted, anything
// else an error. Keys longer than 128 characters are replaced by their
// SHA-256 so the column and index stay small, and so are keys Postgres
// could not store as text (a NUL byte from the event's data): hashing keeps
// distinct keys distinct, where cleaning them could merge two.
func evalKey(ctx context.Context, prg cel.Program, act activation) (string, error) {
	out, _, err := prg.ContextEval(ctx, act.vars)
	if err != nil {
		return "", fmt.Errorf("evaluate throttle key: %w", err)
	}
	var key string
	switch v := out.(type) {
	case types.String:
		key = string(v)
	case types.Int:
		key = strconv.FormatInt(int64(v), 10)
	case types.Uint:
		key = strconv.FormatUint(uint64(v), 10)
	case types.Double:
		key = strconv.FormatFloat(float64(v), 'f', -1, 64)
	case types.Bool:
		key = strconv.FormatBool(bool(v))
	default:
		return "", fmt.Errorf("evaluate throttle key: returned %s, not a string or number", out.Type())
	}
	if len(key) > maxThrottleKeyLen || pgtext.Clean(key) != key {
		sum := sha256.Sum256([]byte(key))
		key = "sha256:" + hex.EncodeToString(sum[:])
	}
	return key, nil
}
