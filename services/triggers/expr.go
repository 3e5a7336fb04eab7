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
	"cel.dev/cel-go/common/types"
	"cel.dev/cel-go/ext"

	"github.com/retryd/retryd/pkg/contract"
	"github.com/retryd/retryd/projections/pgtext"
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
	prg, err := e.env.Program(ast,
		cel.CostLimit(e.costLimit),
		cel.InterruptCheckFrequency(64),
		cel.EvalOptions(cel.OptOptimize),
	)
	if err != nil {
		return nil, invalidField(field, "cannot be planned: "+err.Error())
	}
	return prg, nil
}

// maxJoinSeparator is the longest separator join() may use: with a
// literal this short the result stays within a few times the event's size.
const maxJoinSeparator = 8

// boundedAllocation refuses the string functions whose result can be far
// larger than the event they read. CEL charges a call's cost from the size
// of its result, that is, after allocating it: the cost limit cannot stop
// `data.s.replace("a", data.s)` (a 30 kB string became 858 MiB) or
// `"%s%s%s%s".format([data.s, data.s, data.s, data.s])`. What is left (size, contains, matches,
// split, substring, lowerAscii, join with a short literal, +, ...) makes
// results at most a few times its inputs, which the cost limit bounds.
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
