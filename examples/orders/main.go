// Command orders is a service that consumes its own JetStream stream,
// ORDERS, and ships each order placed (a message on SHIPMENTS, keyed by
// the order). Its handler is wrapped with pkg/owner, the owner half of
// retryd's contract, for a kind of its own, "order": an order whose
// shipping fails is retried by the scheduler with the kind's backoff
// policy, one that must wait is held without using a retry, and every
// attempt is a fact on RETRIES that says why. README.md walks through it.
//
// Run it next to the dev runner (which runs the scheduler and creates
// RETRIES):
//
//	NATS_URL=nats://127.0.0.1:4222 go run ./examples/orders -place 3
//
// It uses nothing of retryd but the SDK module (pkg), as a service of
// yours would. SIGTERM or Ctrl-C stops it: no new order is taken, the
// attempts running finish and report, and it exits 0.
package main

import (
	"cmp"
	"context"
	"encoding/json"
	"errors"
	"flag"
	"fmt"
	"log/slog"
	"os"
	"os/signal"
	"syscall"
	"time"

	"github.com/nats-io/nats.go"
	"github.com/nats-io/nats.go/jetstream"

	"github.com/retryd/retryd/pkg/contract"
	"github.com/retryd/retryd/pkg/owner"
)

// source names the example on the facts it publishes by hand (releases).
const source = "orders-example"

// config is what the flags set.
type config struct {
	natsURL string
	// ackWait is how long an order on ORDERS, or a due on RETRIES, waits
	// for its ack before it is delivered again.
	ackWait        time.Duration
	republishAfter time.Duration
	// slowAfterShipment is shipper's test knob.
	slowAfterShipment time.Duration
}

func main() {
	cfg := config{natsURL: cmp.Or(os.Getenv("NATS_URL"), nats.DefaultURL)}
	flag.DurationVar(&cfg.ackWait, "ack-wait", time.Minute, "how long an order or a due waits for its ack before it is delivered again; an attempt is cut at half of it")
	flag.DurationVar(&cfg.republishAfter, "republish-after", 0, "how long a failure or hold waits for the scheduler's decision before it is looked for on RETRIES (0: pkg/owner's default, 3m)")
	place := flag.Int("place", 0, "publish this many sample orders of each kind (ships, fails twice, held) at start")
	reopen := flag.String("reopen", "", "publish that this warehouse reopened, releasing the orders held for it, and exit")
	flag.DurationVar(&cfg.slowAfterShipment, "slow-after-shipment", 0, "test knob: each attempt waits this long after its shipment, before it reports")
	flag.Parse()
	log := slog.New(slog.NewTextHandler(os.Stderr, nil))
	ctx, stop := signal.NotifyContext(context.Background(), syscall.SIGINT, syscall.SIGTERM)
	defer stop()
	var err error
	if *reopen != "" {
		err = reopenWarehouse(ctx, cfg.natsURL, *reopen)
	} else {
		err = run(ctx, log, cfg, *place)
	}
	if err != nil {
		log.Error("orders failed", slog.Any("error", err))
		os.Exit(1)
	}
}

// run serves until ctx ends, then stops gracefully.
func run(ctx context.Context, log *slog.Logger, cfg config, place int) error {
	nc, js, err := connect(cfg.natsURL)
	if err != nil {
		return err
	}
	defer nc.Close()
	if err := ensureStreams(ctx, js); err != nil {
		return err
	}
	// RETRIES is retryd's: the services create it. Wait for it rather
	// than create it with settings that are not the deployment's.
	if err := waitStream(ctx, log, js, contract.StreamRetries); err != nil || ctx.Err() != nil {
		return err
	}
	orders, err := js.CreateOrUpdateConsumer(ctx, OrdersStream, jetstream.ConsumerConfig{
		Durable: "orders-shipping", FilterSubject: PlacedSubject,
		AckPolicy: jetstream.AckExplicitPolicy, AckWait: cfg.ackWait, MaxDeliver: -1,
	})
	if err != nil {
		return fmt.Errorf("create consumer orders-shipping: %w", err)
	}
	shipments, err := js.Stream(ctx, ShipmentsStream)
	if err != nil {
		return fmt.Errorf("look up stream %s: %w", ShipmentsStream, err)
	}
	ship := &shipper{js: js, shipments: shipments, slowAfterShipment: cfg.slowAfterShipment}

	// --- retryd: the wrapping (quoted in README.md) -------------------
	o, err := owner.New(owner.Config{JS: js, Kind: Kind, Handler: ship.ship, Logger: log,
		AckWait: cfg.ackWait, RepublishAfter: cfg.republishAfter,
		// An attempt ends before ORDERS would deliver its order again.
		Timeout: cfg.ackWait / 2})
	if err != nil {
		return err
	}
	if err := o.Start(ctx); err != nil { // runs the retries: retry.order.due.*
		return err
	}
	cc, err := orders.Consume(func(msg jetstream.Msg) {
		var order Order
		if json.Unmarshal(msg.Data(), &order) != nil {
			_ = msg.TermWithReason("not a JSON order")
			return
		}
		// Attempt 1 runs here, the later ones when retryd says.
		err := o.Run(context.WithoutCancel(ctx), &owner.Item{ID: order.OrderID, Attempt: 1, Payload: msg.Data()})
		switch {
		case errors.Is(err, contract.ErrInvalid): // no fact could ever be stored
			_ = msg.TermWithReason(err.Error())
		case err != nil: // the fact is not stored: deliver the order again
			_ = msg.NakWithDelay(time.Second)
		default: // stored: its retries are retryd's from here on
			_ = msg.Ack()
		}
	}, jetstream.PullMaxMessages(1)) // one at a time, as the callback runs them
	if err != nil {
		return errors.Join(fmt.Errorf("consume %s: %w", OrdersStream, err), o.Stop(ctx))
	}
	// --- end of the wrapping -------------------------------------------

	log.Info("orders started", slog.String("kind", Kind))
	if err := placeSamples(ctx, js, place); err != nil {
		log.Error("place sample orders failed", slog.Any("error", err))
	}
	<-ctx.Done()
	// The attempt running finishes and reports; orders not yet taken
	// stay on ORDERS for the next instance.
	cc.Stop()
	<-cc.Closed()
	stopCtx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	return o.Stop(stopCtx)
}

func connect(url string) (*nats.Conn, jetstream.JetStream, error) {
	nc, err := nats.Connect(url, nats.Name(source), nats.MaxReconnects(-1))
	if err != nil {
		return nil, nil, fmt.Errorf("connect to %s: %w", url, err)
	}
	js, err := jetstream.New(nc)
	if err != nil {
		nc.Close()
		return nil, nil, fmt.Errorf("new jetstream: %w", err)
	}
	return nc, js, nil
}

// ensureStreams creates the service's own streams when they are missing;
// existing ones are left as they are.
func ensureStreams(ctx context.Context, js jetstream.JetStream) error {
	for _, cfg := range []jetstream.StreamConfig{
		{Name: OrdersStream, Subjects: []string{"orders.>"}, Storage: jetstream.FileStorage},
		{Name: ShipmentsStream, Subjects: []string{ShipmentSubject("*")}, Storage: jetstream.FileStorage},
	} {
		if _, err := js.CreateStream(ctx, cfg); err != nil && !errors.Is(err, jetstream.ErrStreamNameAlreadyInUse) {
			return fmt.Errorf("create stream %s: %w", cfg.Name, err)
		}
	}
	return nil
}

// waitStream returns once the stream exists or ctx ends.
func waitStream(ctx context.Context, log *slog.Logger, js jetstream.JetStream, name string) error {
	for logged := false; ; logged = true {
		_, err := js.Stream(ctx, name)
		if err == nil {
			return nil
		}
		if !errors.Is(err, jetstream.ErrStreamNotFound) {
			return fmt.Errorf("look up stream %s: %w", name, err)
		}
		if !logged {
			log.Info("waiting for retryd to create its stream", slog.String("stream", name))
		}
		select {
		case <-ctx.Done():
			return nil
		case <-time.After(time.Second):
		}
	}
}

// placeSamples publishes n orders of each kind: one that ships at once,
// one whose warehouse fails twice, one held while its warehouse, eu-1,
// is closed.
func placeSamples(ctx context.Context, js jetstream.JetStream, n int) error {
	stamp := time.Now().UnixMilli()
	for i := range n {
		for j, o := range []Order{
			{SKU: "book", Qty: 1},
			{SKU: "lamp", Qty: 2, FailFirst: 2},
			{SKU: "desk", Qty: 1, Warehouse: "eu-1", HoldFirst: "10m"},
		} {
			o.OrderID = fmt.Sprintf("ord-%d-%d-%d", stamp, i, j)
			if err := placeOrder(ctx, js, o); err != nil {
				return err
			}
		}
	}
	return nil
}

// placeOrder publishes o on orders.placed as the shop does: the order id
// as Nats-Msg-Id, so a shop that sends it twice places it once.
func placeOrder(ctx context.Context, js jetstream.JetStream, o Order) error {
	data, err := json.Marshal(o)
	if err != nil {
		return fmt.Errorf("encode order: %w", err)
	}
	if _, err := js.Publish(ctx, PlacedSubject, data, jetstream.WithMsgID(o.OrderID)); err != nil {
		return fmt.Errorf("place order %s: %w", o.OrderID, err)
	}
	return nil
}

// reopenWarehouse publishes retry.order.released.<warehouse>: every order
// held for the warehouse is due at once, however long its hold had left.
func reopenWarehouse(ctx context.Context, url, warehouse string) error {
	nc, js, err := connect(url)
	if err != nil {
		return err
	}
	defer nc.Close()
	msg, err := contract.NewLifecycleMsg(source, contract.Released, contract.ReleasedData{
		Kind: Kind, HoldKey: warehouse, Reason: contract.ReleaseResume, By: source, ReleasedAt: time.Now(),
	}, time.Now())
	if err != nil {
		return fmt.Errorf("reopen warehouse: %w", err)
	}
	if _, err := js.PublishMsg(ctx, msg); err != nil {
		return fmt.Errorf("reopen warehouse: publish %s: %w", msg.Subject, err)
	}
	return nil
}
