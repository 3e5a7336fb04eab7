// Package contract holds retryd's public wire contract: the CloudEvents
// envelope, the retry lifecycle events, the stream subjects and the
// Nats-Msg-Id formats that make every publish idempotent.
//
// Everything that crosses NATS goes through this package so that producers,
// the scheduler and owners agree byte for byte. Decoding is strict: unknown
// fields, wrong types, oversized or deeply nested input and ids that are not
// subject-safe are rejected with an error that names the field.
package contract
