package errclass_test

import (
	"context"
	"errors"
	"fmt"
	"time"

	"github.com/retryd/retryd/pkg/errclass"
)

// Typed errors carry their class, hint and flag through fmt.Errorf wrapping.
func Example() {
	charge := func() error {
		// e.g. an HTTP 429 with "Retry-After: 30"
		err := errclass.New(errclass.RateLimit, "payments API: too many requests")
		return errclass.RetryAfter(err, 30*time.Second)
	}
	err := fmt.Errorf("charge invoice: %w", charge())

	class, hint := errclass.DefaultClassifier().Classify(err)
	fmt.Println(class, hint, class.Retryable())
	fmt.Println(errors.Is(err, errclass.ErrRateLimit))
	// Output:
	// rate_limit 30s true
	// true
}

func ExampleNonRetryable() {
	err := errclass.NonRetryable(errclass.Wrap(errclass.Temporary, errors.New("customer deleted")))
	e, _ := errclass.As(fmt.Errorf("sync: %w", err))
	fmt.Println(e.Class, e.NonRetryable, errors.Is(err, errclass.ErrNonRetryable))
	// Output:
	// temporary true true
}

func ExampleClassifier_Classify() {
	c := errclass.DefaultClassifier()
	for _, err := range []error{
		fmt.Errorf("query: %w", context.DeadlineExceeded),
		errors.New("dial tcp 10.0.0.7:443: connect: connection refused"),
		errors.New("POST /v2/messages: 401 Unauthorized"),
		errors.New("invalid job configuration: missing template"),
		errors.New("something odd happened"),
	} {
		class, _ := c.Classify(err)
		fmt.Printf("%-14s retry=%v\n", class, class.Retryable())
	}
	// Output:
	// timeout        retry=true
	// network        retry=true
	// authentication retry=false
	// validation     retry=false
	// unknown        retry=true
}

func ExampleNewClassifier() {
	patterns := errclass.DefaultPatterns()
	patterns[errclass.Validation] = append(patterns[errclass.Validation], `card declined`)
	patterns[errclass.Temporary] = append(patterns[errclass.Temporary], `deadlock detected`)
	c, err := errclass.NewClassifier(patterns)
	if err != nil {
		panic(err)
	}
	fmt.Println(c.ClassifyMessage("Card declined by issuer"))
	fmt.Println(c.ClassifyMessage("ERROR: deadlock detected (SQLSTATE 40P01)"))
	// Output:
	// validation
	// temporary
}

func ExampleParse() {
	for _, s := range []string{"temporary_error", "validation_error", "rate_limit", "fatal"} {
		c, err := errclass.Parse(s)
		fmt.Println(c, err != nil)
	}
	// Output:
	// temporary false
	// validation false
	// rate_limit false
	// unknown true
}
