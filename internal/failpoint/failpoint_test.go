package failpoint_test

import (
	"context"
	"errors"
	"testing"

	"github.com/stretchr/testify/require"

	"github.com/retryd/retryd/internal/durable"
	"github.com/retryd/retryd/internal/failpoint"
)

func TestAt(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	var none failpoint.Func
	require.NoError(t, none.At(ctx, "anywhere"))

	killed := errors.New("killed")
	var seen []string
	f := failpoint.Func(func(_ context.Context, point string) error {
		seen = append(seen, point)
		if point == "b.committed" {
			return killed
		}
		return nil
	})
	require.NoError(t, f.At(ctx, "a.committed"))
	err := f.At(ctx, "b.committed")
	require.ErrorIs(t, err, killed)
	require.ErrorIs(t, err, durable.ErrAbandon, "a consumer must leave the message unacked")
	var fp *failpoint.Error
	require.ErrorAs(t, err, &fp)
	require.Equal(t, "b.committed", fp.Point)
	require.Equal(t, "failpoint b.committed: killed", err.Error())
	require.Equal(t, []string{"a.committed", "b.committed"}, seen)
}
