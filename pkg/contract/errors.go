package contract

import (
	"errors"
	"fmt"
)

var (
	// ErrInvalid is wrapped by every validation and decoding error: the input
	// is malformed and retrying it will not help (HTTP 400, NATS Term).
	ErrInvalid = errors.New("invalid input")
	// ErrTooLarge is wrapped when input exceeds a size limit (HTTP 413).
	ErrTooLarge = errors.New("input too large")
)

// FieldError says which field of an input is wrong and why.
type FieldError struct {
	Field  string
	Reason string
	// Err is ErrInvalid or ErrTooLarge.
	Err error
}

func (e *FieldError) Error() string {
	if e.Field == "" {
		return e.Reason
	}
	return e.Field + " " + e.Reason
}

func (e *FieldError) Unwrap() error { return e.Err }

func fieldErr(field, reason string) error {
	return &FieldError{Field: field, Reason: reason, Err: ErrInvalid}
}

func tooLarge(field string, size, limit int) error {
	return &FieldError{
		Field:  field,
		Reason: fmt.Sprintf("is %d bytes, more than the limit of %d", size, limit),
		Err:    ErrTooLarge,
	}
}
