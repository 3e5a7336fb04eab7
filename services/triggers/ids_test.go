package triggers

import (
	"testing"

	"github.com/stretchr/testify/require"

	"github.com/retryd/retryd/pkg/contract"
)

func TestDeliveryIDs(t *testing.T) {
	t.Parallel()
	a := DeliveryID("01JEVENT", "trigger-1")
	require.Len(t, a, 26)
	require.Equal(t, a, DeliveryID("01JEVENT", "trigger-1"), "deterministic")
	require.NotEqual(t, a, DeliveryID("01JEVENT", "trigger-2"))
	require.NotEqual(t, a, DeliveryID("01JEVENT2", "trigger-1"))
	require.NotEqual(t, DeliveryID("ab", "c"), DeliveryID("a", "bc"), "the separator keeps ids apart")
	require.NoError(t, contract.ValidateID("delivery", a))
	require.NoError(t, contract.ValidateID("run", RunID(a)))
	require.Equal(t, "run-"+a, RunID(a))
}
