// Package owner is the owner half of retryd's contract (docs/contract.md)
// in one place, for any kind of item: run an attempt, report its fact
// (retry.<kind>.succeeded, failed or held) with the deterministic
// Nats-Msg-Id, keep each failure and hold until the scheduler's decision
// is seen and publish it again if a purge of RETRIES removed it first,
// and run the later attempts when retry.<kind>.due.<id> arrives.
//
// A service that already consumes its own stream gets durable,
// explainable retries by handing each message's first attempt to
// Owner.Run and acking the message when Run returns nil (see
// examples/orders):
//
//	o, err := owner.New(owner.Config{JS: js, Kind: "order", Handler: ship})
//	...
//	err = o.Start(ctx)
//	...
//	// in the service's own consumer:
//	if err := o.Run(ctx, &owner.Item{ID: orderID, Attempt: 1, Payload: msg.Data()}); err != nil {
//		_ = msg.NakWithDelay(time.Second) // the fact is not stored: try again
//		return
//	}
//	_ = msg.Ack()
//
// The worker SDK (pkg/worker) reports through the same Reporter.
package owner
