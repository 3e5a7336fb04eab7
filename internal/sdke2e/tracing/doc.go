// Package tracing holds the end-to-end tests of pkg/tracing (see package
// sdke2e): trace context carried through NATS messages.
package tracing
