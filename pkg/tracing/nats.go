package tracing

import (
	"context"

	"github.com/nats-io/nats.go"
	"go.opentelemetry.io/otel"
	"go.opentelemetry.io/otel/attribute"
	"go.opentelemetry.io/otel/codes"
	"go.opentelemetry.io/otel/propagation"
	semconv "go.opentelemetry.io/otel/semconv/v1.40.0"
	"go.opentelemetry.io/otel/trace"
)

// headerMsgID is contract.HeaderMsgID, repeated so this package stays a
// leaf.
const headerMsgID = "Nats-Msg-Id"

// HeaderCarrier adapts nats.Header to propagation.TextMapCarrier. Header
// names are kept as the propagators write them (traceparent, tracestate,
// baggage), which is how they show in `nats stream view`.
type HeaderCarrier nats.Header

var _ propagation.TextMapCarrier = HeaderCarrier{}

// Get returns the first value of key, matching nats.Header.Get.
func (c HeaderCarrier) Get(key string) string { return nats.Header(c).Get(key) }

// Set replaces the values of key.
func (c HeaderCarrier) Set(key, value string) { nats.Header(c).Set(key, value) }

// Keys lists the header names.
func (c HeaderCarrier) Keys() []string {
	keys := make([]string, 0, len(c))
	for k := range c {
		keys = append(keys, k)
	}
	return keys
}

// Inject writes the trace context of ctx into h (which must not be nil).
// Without tracing, or without a span in ctx, h is left unchanged.
func Inject(ctx context.Context, h nats.Header) {
	if h == nil {
		return
	}
	otel.GetTextMapPropagator().Inject(ctx, HeaderCarrier(h))
}

// Extract returns ctx carrying the trace context found in h, if any.
func Extract(ctx context.Context, h nats.Header) context.Context {
	if h == nil {
		return ctx
	}
	return otel.GetTextMapPropagator().Extract(ctx, HeaderCarrier(h))
}

// StartConsume starts the consumer span of one message received on
// subject by the durable consumer, as a child of the trace context in h.
// The caller ends the span once the message is handled (acked, nacked or
// terminated) and passes the returned ctx to what the message causes,
// notably the transaction that writes to the outbox, so the trace
// continues in the messages published next.
func StartConsume(ctx context.Context, subject, consumer string, h nats.Header, attrs ...attribute.KeyValue) (context.Context, trace.Span) {
	ctx = Extract(ctx, h)
	ctx, span := otel.Tracer(instrumentation).Start(ctx, "process "+consumer, trace.WithSpanKind(trace.SpanKindConsumer))
	// The scheduler starts one for every fact it applies: with tracing off
	// the attributes are not even built (as in StartPublish).
	if !span.IsRecording() {
		return ctx, span
	}
	span.SetAttributes(
		semconv.MessagingSystemKey.String("nats"),
		semconv.MessagingOperationTypeProcess,
		semconv.MessagingOperationName("process"),
		semconv.MessagingDestinationName(subject),
		semconv.MessagingConsumerGroupName(consumer),
	)
	if id := h.Get(headerMsgID); id != "" {
		span.SetAttributes(semconv.MessagingMessageID(id))
	}
	span.SetAttributes(attrs...)
	return ctx, span
}

// StartPublish starts the producer span of a message published directly
// (not through the outbox) and injects its context into msg's headers.
// The caller ends the span once the PubAck arrived or the publish failed.
func StartPublish(ctx context.Context, msg *nats.Msg, attrs ...attribute.KeyValue) (context.Context, trace.Span) {
	if msg.Header == nil {
		msg.Header = nats.Header{}
	}
	ctx, span := otel.Tracer(instrumentation).Start(ctx, "publish "+msg.Subject, trace.WithSpanKind(trace.SpanKindProducer))
	// The due loop publishes tens of thousands of messages a second: with
	// tracing off (a span that records nothing) the attributes are not
	// even built.
	if span.IsRecording() {
		span.SetAttributes(
			semconv.MessagingSystemKey.String("nats"),
			semconv.MessagingOperationTypeSend,
			semconv.MessagingOperationName("publish"),
			semconv.MessagingDestinationName(msg.Subject),
		)
		if id := msg.Header.Get(headerMsgID); id != "" {
			span.SetAttributes(semconv.MessagingMessageID(id))
		}
		span.SetAttributes(attrs...)
	}
	Inject(ctx, msg.Header)
	return ctx, span
}

// Fail marks span as failed with err (nil leaves it unchanged).
func Fail(span trace.Span, err error) {
	if err == nil {
		return
	}
	span.RecordError(err)
	span.SetStatus(codes.Error, err.Error())
}
