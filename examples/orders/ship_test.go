package main

import (
	"context"
	"encoding/json"
	"testing"
	"time"

	"github.com/stretchr/testify/require"

	"github.com/retryd/retryd/pkg/errclass"
	"github.com/retryd/retryd/pkg/owner"
)

// What the handler answers before it ships decides the order's fact: a
// hold for a closed warehouse, keyed by it; a retryable failure for the
// warehouse's 503; a failure no retry can mend for an order that does not
// decode.
func TestShipAnswersBeforeShipping(t *testing.T) {
	t.Parallel()
	s := &shipper{} // no stream: none of these reach it
	item := func(attempt int, o any) *owner.Item {
		raw, err := json.Marshal(o)
		require.NoError(t, err)
		return &owner.Item{Kind: Kind, ID: "ord-1", Attempt: attempt, Payload: raw}
	}

	err := s.ship(context.Background(), item(1, Order{OrderID: "ord-1", Warehouse: "eu-1", HoldFirst: "1h"}))
	h, ok := owner.AsHold(err)
	require.True(t, ok, "held: %v", err)
	require.Equal(t, &owner.HoldError{After: time.Hour, Detail: "warehouse eu-1 is closed", Key: "eu-1"}, h)

	err = s.ship(context.Background(), item(1, Order{OrderID: "ord-1", FailFirst: 2}))
	e, ok := errclass.As(err)
	require.True(t, ok, "classified: %v", err)
	require.Equal(t, errclass.Temporary, e.Class)

	err = s.ship(context.Background(), item(1, "not an order"))
	e, ok = errclass.As(err)
	require.True(t, ok, "classified: %v", err)
	require.Equal(t, errclass.Validation, e.Class)
	require.False(t, e.Class.Retryable())
}
