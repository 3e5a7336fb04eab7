package main

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"time"

	"github.com/nats-io/nats.go"
	"github.com/nats-io/nats.go/jetstream"

	"github.com/retryd/retryd/pkg/errclass"
	"github.com/retryd/retryd/pkg/owner"
)

// The service's own streams and subjects, and its retry kind.
const (
	OrdersStream    = "ORDERS"
	ShipmentsStream = "SHIPMENTS"
	PlacedSubject   = "orders.placed"
	// Kind is the kind of the orders' retries: retry.order.<event>.<order id>.
	Kind = "order"
)

// ShipmentSubject is where the shipment of an order is recorded.
func ShipmentSubject(orderID string) string { return "shipments." + orderID }

// Order is what the shop publishes on orders.placed.
type Order struct {
	OrderID   string `json:"order_id"`
	SKU       string `json:"sku"`
	Qty       int    `json:"qty"`
	Warehouse string `json:"warehouse,omitempty"`
	// FailFirst and HoldFirst are demo knobs standing in for the
	// warehouse's answers: its API fails the order's first FailFirst
	// attempts with a 503, and the warehouse is closed (for stock-taking)
	// during the order's first attempt, which waits HoldFirst (a Go
	// duration) or until the warehouse reopens.
	FailFirst int    `json:"fail_first,omitempty"`
	HoldFirst string `json:"hold_first,omitempty"`
}

// Shipment is the effect of an order: one message on
// shipments.<order id>, whatever number of attempts ran.
type Shipment struct {
	OrderID   string `json:"order_id"`
	SKU       string `json:"sku"`
	Qty       int    `json:"qty"`
	Warehouse string `json:"warehouse"`
	// Attempt is the attempt that shipped it.
	Attempt int `json:"attempt"`
}

// shipper is the service's handler, the code it had before retryd: it
// ships an order by recording its shipment.
type shipper struct {
	js        jetstream.JetStream
	shipments jetstream.Stream
	// slowAfterShipment is a test knob: each attempt waits this long
	// after the shipment is stored, ignoring its context, as a call that
	// hangs would. A kill -9 in that wait is the worst moment for a crash:
	// the effect is done and no fact says so.
	slowAfterShipment time.Duration
}

// ship runs one attempt of an order. The error decides what retryd
// records: nil succeeded; owner.Hold held (no retry used); errclass
// errors and any other error failed, retried by the kind's policy.
func (s *shipper) ship(ctx context.Context, it *owner.Item) error {
	var o Order
	if err := json.Unmarshal(it.Payload, &o); err != nil {
		// The same bytes fail the same way on every attempt.
		return errclass.Wrap(errclass.Validation, fmt.Errorf("decode order: %w", err))
	}
	if o.Warehouse == "" {
		o.Warehouse = "main"
	}
	if o.HoldFirst != "" && it.Attempt == 1 {
		d, err := time.ParseDuration(o.HoldFirst)
		if err != nil {
			return errclass.Wrap(errclass.Validation, fmt.Errorf("decode order: hold_first: %w", err))
		}
		// Keyed by the warehouse: its reopening releases every order
		// held for it at once (releaseWarehouse).
		return owner.Hold(d, "warehouse "+o.Warehouse+" is closed", owner.WithHoldKey(o.Warehouse))
	}
	if it.Attempt <= o.FailFirst {
		return errclass.Wrap(errclass.Temporary, errors.New("warehouse api: 503 service unavailable"))
	}
	return s.record(ctx, o, it.Attempt)
}

// record stores the order's shipment once. An attempt can run twice (a
// crash after the shipment and before its fact, a redelivery): a
// shipment already on the stream is the effect of an earlier run, and
// the Nats-Msg-Id makes two runs racing store one.
func (s *shipper) record(ctx context.Context, o Order, attempt int) error {
	subject := ShipmentSubject(o.OrderID)
	_, err := s.shipments.GetLastMsgForSubject(ctx, subject)
	if errors.Is(err, jetstream.ErrMsgNotFound) {
		err = s.publish(ctx, subject, Shipment{OrderID: o.OrderID, SKU: o.SKU, Qty: o.Qty, Warehouse: o.Warehouse, Attempt: attempt})
	}
	if err != nil {
		return errclass.Wrap(errclass.Network, fmt.Errorf("record shipment: %w", err))
	}
	if s.slowAfterShipment > 0 {
		time.Sleep(s.slowAfterShipment)
	}
	return nil
}

func (s *shipper) publish(ctx context.Context, subject string, sh Shipment) error {
	data, err := json.Marshal(sh)
	if err != nil {
		return fmt.Errorf("encode shipment: %w", err)
	}
	msg := &nats.Msg{Subject: subject, Data: data, Header: nats.Header{}}
	msg.Header.Set(jetstream.MsgIDHeader, "shipment:"+sh.OrderID)
	if _, err := s.js.PublishMsg(ctx, msg); err != nil {
		return fmt.Errorf("publish %s: %w", subject, err)
	}
	return nil
}
