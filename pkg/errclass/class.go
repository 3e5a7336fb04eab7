// Package errclass sorts errors into the classes retry policies act on:
// retryable timeout, network, rate_limit and temporary; non-retryable
// authentication, permission and validation; unknown (retried by default).
//
// Go code classifies its own failures with typed errors (New, Wrap,
// NonRetryable, RetryAfter), in the manner of Temporal's ApplicationError;
// they survive fmt.Errorf("...: %w") wrapping. Everything else is classified
// by a Classifier from standard library error types (context deadlines, net
// errors, syscall errnos) and then from configurable message patterns.
package errclass

import (
	"errors"
	"fmt"
	"strings"
)

// Class is an error class as carried in error.class of failed events.
type Class string

// The error classes.
const (
	Timeout        Class = "timeout"
	Network        Class = "network"
	RateLimit      Class = "rate_limit"
	Temporary      Class = "temporary"
	Authentication Class = "authentication"
	Permission     Class = "permission"
	Validation     Class = "validation"
	Unknown        Class = "unknown"
)

// Classes lists every class, retryable ones first. Classifiers built with
// NewClassifier try patterns in this order, so a message that matches a
// retryable and a non-retryable class is retried.
func Classes() []Class {
	return []Class{Timeout, RateLimit, Network, Temporary, Authentication, Permission, Validation, Unknown}
}

// ErrUnknownClass is wrapped by Parse errors.
var ErrUnknownClass = errors.New("unknown error class")

// Parse reads a class name, ignoring case and surrounding space. It accepts
// temporary_error and validation_error as aliases, the names some job
// queues use.
func Parse(s string) (Class, error) {
	norm := strings.ToLower(strings.TrimSpace(s))
	switch norm {
	case "temporary_error":
		return Temporary, nil
	case "validation_error":
		return Validation, nil
	}
	c := Class(norm)
	if c.Valid() {
		return c, nil
	}
	return Unknown, fmt.Errorf("%w: %q (want one of timeout, network, rate_limit, temporary, authentication, permission, validation, unknown)", ErrUnknownClass, s)
}

// Valid reports whether c is one of the classes.
func (c Class) Valid() bool {
	for _, k := range Classes() {
		if c == k {
			return true
		}
	}
	return false
}

// Retryable reports whether errors of class c are retried when a policy says
// nothing about c: false for authentication, permission and validation, true
// for every other class, including unknown and unrecognised ones.
func (c Class) Retryable() bool {
	switch c {
	case Authentication, Permission, Validation:
		return false
	}
	return true
}

func (c Class) String() string { return string(c) }
