package triggers

import "cel.dev/cel-go/cel"

var _ = cel.NewEnv
