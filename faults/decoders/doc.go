// Package decoders holds the fault suite's fuzz targets for the decoders
// that pkg/contract's own fuzz tests do not cover: run finishes, event
// messages, bare envelopes, subjects, and serve.DecodeJSON with the
// services' request types. Every target checks that no input panics and
// that every refusal is a *contract.FieldError wrapping exactly one of
// contract.ErrInvalid and contract.ErrTooLarge (what HTTP 400/413 and
// NATS Term are mapped from).
package decoders
