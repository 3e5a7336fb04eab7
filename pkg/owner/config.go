package owner

import (
	"errors"
	"fmt"
	"log/slog"
	"os"
	"slices"
	"strconv"
	"strings"
	"time"
	"unicode"
	"unicode/utf8"

	"github.com/nats-io/nats.go/jetstream"
	"github.com/prometheus/client_golang/prometheus"

	"github.com/retryd/retryd/pkg/contract"
	"github.com/retryd/retryd/pkg/errclass"
	"github.com/retryd/retryd/pkg/internal/sdkconfig"
)

// Defaults of Config.
const (
	DefaultConcurrency = 4
	DefaultTimeout     = 5 * time.Minute
	DefaultAckWait     = 30 * time.Second
)

// reservedKinds are the kinds retryd's own owners run: ingress (event),
// triggers (event-trigger, run) and the worker SDK (job).
var reservedKinds = []string{contract.KindEvent, contract.KindEventTrigger, contract.KindJob, contract.KindRun}

// Config configures an Owner. JS, Kind and Handler are required.
type Config struct {
	// JS consumes the dues and publishes the facts. The RETRIES stream
	// must exist (any retryd service creates it, or
	// `nats stream add --config deploy/streams/RETRIES.json`).
	JS jetstream.JetStream
	// Kind is the items' kind, the <kind> of retry.<kind>.<event>.<id>:
	// lowercase letters, digits, '_' and '-'. The kinds retryd's own
	// services own (event, event-trigger, job, run) are refused.
	Kind string
	// Handler runs one attempt of an item.
	Handler Handler
	// Source is the CloudEvents source of the facts. Default
	// "retryd/owner/<kind>".
	Source string
	// ExecutorID names this instance on every fact it publishes (field
	// executor). Default: the host name, "-" and the process id.
	ExecutorID string
	// Concurrency is how many attempts run at once in this process.
	// Default 4.
	Concurrency int
	// Timeout bounds an attempt whose item carries no timeout_ms: the
	// handler's context ends then. Default 5 minutes.
	Timeout time.Duration
	// AckWait is the due consumer's ack wait; an attempt running longer
	// sends an in-progress ack every AckWait/3. Default 30s.
	AckWait time.Duration
	// Classifier classifies errors that are not *errclass.Error.
	// Default errclass.DefaultClassifier().
	Classifier *errclass.Classifier
	// PendingLimit and RepublishAfter are the Reporter's (ReporterConfig):
	// how many failed and held facts are kept until their decision, and
	// how long one waits before it is looked for on RETRIES.
	PendingLimit   int
	RepublishAfter time.Duration
	// Logger receives kinds, ids, attempts and classes, never payloads.
	// Nil discards the logs.
	Logger *slog.Logger
	// Registerer receives the metrics (retryd_owner_*). Default: a
	// private registry.
	Registerer prometheus.Registerer
	// Now is the clock, for tests. Default time.Now.
	Now func() time.Time
}

func (c *Config) validate() error {
	switch {
	case c.JS == nil:
		return errors.New("Config.JS is required")
	case c.Handler == nil:
		return errors.New("Config.Handler is required")
	}
	if err := contract.ValidateToken("Config.Kind", c.Kind); err != nil {
		return err
	}
	if slices.Contains(reservedKinds, c.Kind) {
		return fmt.Errorf("Config.Kind %q is owned by retryd's own services; pick a kind of your own", c.Kind)
	}
	if c.Source == "" {
		c.Source = "retryd/owner/" + c.Kind
	}
	if len(c.Source) > 256 {
		return errors.New("Config.Source must be at most 256 characters")
	}
	if c.ExecutorID == "" {
		c.ExecutorID = DefaultExecutorID(os.Hostname, os.Getpid())
	}
	if err := contract.ValidateExecutor("Config.ExecutorID", c.ExecutorID); err != nil {
		return err
	}
	if c.Concurrency == 0 {
		c.Concurrency = DefaultConcurrency
	}
	if c.Concurrency < 1 || c.Concurrency > 10_000 {
		return fmt.Errorf("Config.Concurrency must be between 1 and 10000, got %d", c.Concurrency)
	}
	if c.Timeout == 0 {
		c.Timeout = DefaultTimeout
	}
	if c.AckWait == 0 {
		c.AckWait = DefaultAckWait
	}
	if c.Timeout < 0 {
		return fmt.Errorf("Config.Timeout must not be negative, got %s", c.Timeout)
	}
	if c.AckWait < 300*time.Millisecond {
		return fmt.Errorf("Config.AckWait must be at least 300ms, got %s", c.AckWait)
	}
	sdkconfig.Fill(&c.Classifier, &c.Registerer, &c.Logger, &c.Now)
	return nil
}

// DefaultExecutorID is "<host name>-<pid>", shortened to
// contract.MaxTokenLen bytes by cutting the host name (at a rune
// boundary), not the pid: two processes on one host must stay apart.
// Characters the contract refuses become '_'; a host name that cannot be
// read is "unknown".
func DefaultExecutorID(hostname func() (string, error), pid int) string {
	host, err := hostname()
	if err != nil || host == "" {
		host = "unknown"
	}
	host = strings.Map(func(r rune) rune {
		if r == utf8.RuneError || !unicode.IsPrint(r) {
			return '_'
		}
		return r
	}, host)
	suffix := "-" + strconv.Itoa(pid)
	for len(host)+len(suffix) > contract.MaxTokenLen {
		_, size := utf8.DecodeLastRuneInString(host)
		host = host[:len(host)-size]
	}
	return host + suffix
}
