package envvar_test

import (
	"testing"
	"time"

	"github.com/stretchr/testify/require"

	"github.com/retryd/retryd/internal/envvar"
)

// setenv sets the name, value pairs for the test.
func setenv(t *testing.T, kv ...string) {
	t.Helper()
	for i := 0; i+1 < len(kv); i += 2 {
		t.Setenv(kv[i], kv[i+1])
	}
}

func TestReaderCollectsEveryError(t *testing.T) {
	setenv(t,
		"EV_INT", "12",
		"EV_BAD_INT", "-3",
		"EV_DUR", "1500ms",
		"EV_BAD_DUR", "soon",
		"EV_BOOL", "false",
		"EV_BAD_BOOL", "maybe",
	)
	var r envvar.Reader
	require.Equal(t, 12, r.Int("EV_INT"))
	require.Zero(t, r.Int("EV_UNSET"))
	require.Equal(t, 1500*time.Millisecond, r.Duration("EV_DUR", time.Second))
	require.Equal(t, time.Second, r.Duration("EV_UNSET", time.Second))
	require.False(t, r.Bool("EV_BOOL", true))
	require.True(t, r.Bool("EV_UNSET", true))
	require.NoError(t, r.Err())

	require.Zero(t, r.Int64("EV_BAD_INT"))
	require.Equal(t, time.Second, r.Duration("EV_BAD_DUR", time.Second))
	require.True(t, r.Bool("EV_BAD_BOOL", true))
	err := r.Err()
	require.ErrorContains(t, err, `EV_BAD_INT must be a non-negative integer, got "-3"`)
	require.ErrorContains(t, err, `EV_BAD_DUR must be a duration such as 30s, got "soon"`)
	require.ErrorContains(t, err, `EV_BAD_BOOL must be true or false, got "maybe"`)
	require.Equal(t, "x", envvar.String("EV_UNSET", "x"))
}

func TestRenamedVariableKeepsItsOldName(t *testing.T) {
	setenv(t,
		"EV_OLD_ONLY", "250ms",
		"EV_BOTH_NEW", "7",
		"EV_BOTH_OLD", "7",
		"EV_CLASH_NEW", "1s",
		"EV_CLASH_OLD", "2s",
	)
	var r envvar.Reader
	r.Renamed("EV_NEW_ONLY", "EV_OLD_ONLY")
	r.Renamed("EV_BOTH_NEW", "EV_BOTH_OLD")
	r.Renamed("EV_CLASH_NEW", "EV_CLASH_OLD")

	require.Equal(t, 250*time.Millisecond, r.Duration("EV_NEW_ONLY", time.Second))
	require.Equal(t, []string{"EV_OLD_ONLY is deprecated: it was renamed EV_NEW_ONLY"}, r.Deprecations())
	require.Equal(t, 7, r.Int("EV_BOTH_NEW"), "the same value under both names is fine")
	require.NoError(t, r.Err())

	require.Equal(t, time.Second, r.Duration("EV_CLASH_NEW", 0), "the new name wins")
	require.ErrorContains(t, r.Err(), `EV_CLASH_NEW and EV_CLASH_OLD (its old name) are both set, to "1s" and "2s": set only EV_CLASH_NEW`)
	require.Len(t, r.Deprecations(), 1)
}
