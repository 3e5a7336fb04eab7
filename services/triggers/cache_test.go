package triggers

import (
	"testing"

	"github.com/stretchr/testify/require"
)

func TestProgramCacheEvictsLeastRecentlyUsed(t *testing.T) {
	t.Parallel()
	x, err := newExprEnv(DefaultCostLimit)
	require.NoError(t, err)
	prg, err := x.compilePredicate("true")
	require.NoError(t, err)
	c := newProgramCache(2)
	c.put(programKey{"a", 1}, compiled{predicate: prg})
	c.put(programKey{"b", 1}, compiled{})
	_, ok := c.get(programKey{"a", 1})
	require.True(t, ok)
	c.put(programKey{"c", 1}, compiled{})
	require.Equal(t, 2, c.len())

	got, ok := c.get(programKey{"a", 1})
	require.True(t, ok, "a was used last, b is evicted")
	require.NotNil(t, got.predicate)
	_, ok = c.get(programKey{"b", 1})
	require.False(t, ok)
	_, ok = c.get(programKey{"a", 2})
	require.False(t, ok, "versions are separate entries")

	c.put(programKey{"a", 1}, compiled{})
	got, _ = c.get(programKey{"a", 1})
	require.NotNil(t, got.predicate, "a version's programs never change once cached")
}
