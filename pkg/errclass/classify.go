package errclass

import (
	"context"
	"errors"
	"fmt"
	"io"
	"io/fs"
	"net"
	"os"
	"regexp"
	"strings"
	"sync"
	"syscall"
	"time"
)

// Pattern classifies error messages that match Regexp as Class.
type Pattern struct {
	Class  Class
	Regexp *regexp.Regexp
}

// Classifier classifies errors: typed errors first, then message patterns
// tried in order, the first match winning. A nil *Classifier behaves like
// DefaultClassifier.
type Classifier struct {
	Patterns []Pattern
}

// status matches an HTTP status code only next to a word that says it is
// one ("status 503", "HTTP/1.1 429", "code: 400", "error 401"), so that
// "processed 400 rows" stays unclassified.
func status(codes string) string {
	return `\b(?:status|code|http(?:/[0-9.]+)?|error|response)\b[\s:=#-]{0,3}(?:` + codes + `)\b`
}

// DefaultPatterns returns the seed patterns per class, as given to
// NewClassifier (matched case-insensitively). Change the map and pass it to
// NewClassifier to extend them.
func DefaultPatterns() map[Class][]string {
	return map[Class][]string{
		Timeout: {
			`\btime[d]?[ -]?outs?\b`, `deadline[ _]?exceeded`, `\bETIMEDOUT\b`, status(`408|504`),
		},
		RateLimit: {
			`rate[ _-]?limit`, `too many requests`, `\bthrottl`, `quota exceeded`, `resource[ _]?exhausted`, status(`429`),
		},
		Network: {
			`\bE(?:CONNREFUSED|CONNRESET|CONNABORTED|PIPE|NETUNREACH|HOSTUNREACH|NOTFOUND|AI_AGAIN)\b`,
			`connection (?:refused|reset|aborted|closed)`, `broken pipe`, `\bEOF\b`, `no such host`,
			`(?:network|host) (?:is )?unreachable`, `no route to host`,
		},
		Temporary: {
			`temporar`, `unavailable`, `internal server error`, `bad gateway`, `\btry again\b`, status(`5[0-9][0-9]`),
		},
		Authentication: {
			`\bunauthori[sz]ed\b`, `\bunauthenticated\b`, `invalid credentials`, `authentication (?:failed|required|error)`,
			`(?:invalid|expired|missing) (?:api[ _-]?key|access token|auth(?:entication)? token|bearer token)`, status(`401`),
		},
		Permission: {
			`forbidden`, `permission denied`, `access denied`, `\bnot authori[sz]ed\b`, `insufficient (?:permissions?|privileges|scopes?)`,
			`\bE(?:ACCES|PERM)\b`, status(`403`),
		},
		Validation: {
			`\bvalidation\b`, `\binvalid\b`, `\bmalformed\b`, `\bbad request\b`, `\bunprocessable\b`, status(`400|422`),
		},
	}
}

var defaultPatterns = sync.OnceValue(func() []Pattern {
	c, err := NewClassifier(DefaultPatterns())
	if err != nil {
		panic(fmt.Sprintf("errclass: default patterns: %v", err))
	}
	return c.Patterns
})

// DefaultClassifier returns a classifier with the seed patterns. Each call
// returns a new value: changing its Patterns affects no one else.
func DefaultClassifier() *Classifier {
	return &Classifier{Patterns: append([]Pattern(nil), defaultPatterns()...)}
}

// NewClassifier compiles regular expressions (RE2 syntax, matched
// case-insensitively) per class into one Pattern per class. Classes are
// tried in the order of Classes, retryable ones first.
func NewClassifier(patterns map[Class][]string) (*Classifier, error) {
	for class := range patterns {
		if !class.Valid() {
			return nil, fmt.Errorf("new classifier: %w: %q", ErrUnknownClass, class)
		}
	}
	c := &Classifier{}
	for _, class := range Classes() {
		exprs := patterns[class]
		if len(exprs) == 0 {
			continue
		}
		for i, expr := range exprs {
			if expr == "" {
				return nil, fmt.Errorf("new classifier: %s pattern %d is empty", class, i)
			}
			if _, err := regexp.Compile(expr); err != nil {
				return nil, fmt.Errorf("new classifier: %s pattern %d %q: %w", class, i, expr, err)
			}
		}
		// One alternation per class scans a message once per class
		// instead of once per pattern.
		re, err := regexp.Compile(`(?i)(?:` + strings.Join(exprs, `)|(?:`) + `)`)
		if err != nil {
			return nil, fmt.Errorf("new classifier: %s patterns: %w", class, err)
		}
		c.Patterns = append(c.Patterns, Pattern{Class: class, Regexp: re})
	}
	return c, nil
}

// Classify returns err's class and retry-after hint (zero when none). In
// order: the class of an *Error in the chain; context and os deadlines,
// net.Error timeouts and ETIMEDOUT as timeout; fs.ErrPermission (EACCES,
// EPERM) as permission; connection errnos, EOF, net.ErrClosed and the error
// types of package net (*net.OpError, *net.DNSError, *net.AddrError) as
// network; then the message patterns; then Unknown. The hint comes from an *Error in the
// chain whatever decided the class.
func (c *Classifier) Classify(err error) (Class, time.Duration) {
	if err == nil {
		return Unknown, 0
	}
	var hint time.Duration
	if e, ok := As(err); ok {
		hint = e.RetryAfter
		if e.Class != "" {
			return e.Class, hint
		}
	}
	if class, ok := classifyType(err); ok {
		return class, hint
	}
	return c.ClassifyMessage(err.Error()), hint
}

// ClassifyMessage returns the class of the first pattern matching msg, or
// Unknown.
func (c *Classifier) ClassifyMessage(msg string) Class {
	patterns := defaultPatterns()
	if c != nil {
		patterns = c.Patterns
	}
	for _, p := range patterns {
		if p.Regexp != nil && p.Regexp.MatchString(msg) {
			return p.Class
		}
	}
	return Unknown
}

var networkErrnos = []error{
	syscall.ECONNREFUSED, syscall.ECONNRESET, syscall.ECONNABORTED, syscall.EPIPE,
	syscall.ENETUNREACH, syscall.EHOSTUNREACH, syscall.ENETDOWN,
	net.ErrClosed, io.EOF, io.ErrUnexpectedEOF,
}

func classifyType(err error) (Class, bool) {
	if errors.Is(err, context.DeadlineExceeded) || errors.Is(err, os.ErrDeadlineExceeded) || errors.Is(err, syscall.ETIMEDOUT) {
		return Timeout, true
	}
	var netErr net.Error
	if errors.As(err, &netErr) && netErr.Timeout() {
		return Timeout, true
	}
	// Before the net types: dialing a unix socket without access is a
	// *net.OpError wrapping EACCES.
	if errors.Is(err, fs.ErrPermission) {
		return Permission, true
	}
	for _, target := range networkErrnos {
		if errors.Is(err, target) {
			return Network, true
		}
	}
	// Not every net.Error: syscall.Errno implements it too.
	var opErr *net.OpError
	var dnsErr *net.DNSError
	var addrErr *net.AddrError
	if errors.As(err, &opErr) || errors.As(err, &dnsErr) || errors.As(err, &addrErr) {
		return Network, true
	}
	return "", false
}
