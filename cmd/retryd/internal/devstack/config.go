package devstack

import (
	"errors"
	"fmt"
	"io"
	"time"

	"github.com/rs/zerolog"

	"github.com/retryd/retryd/internal/auth"
	"github.com/retryd/retryd/internal/serve"
	"github.com/retryd/retryd/pkg/worker"
)

// Defaults of Config.
const (
	DefaultDataDir  = ".data"
	DefaultHTTPAddr = "127.0.0.1:8080"
	DefaultNATSHost = "127.0.0.1"
	DefaultNATSPort = 4222
	// DefaultPoolConns is the size of the one Postgres pool every service
	// shares: enough for every consumer's transactions at once.
	DefaultPoolConns = 32
)

// Config configures a Stack. The zero value runs on the defaults: data in
// ./.data, HTTP on 127.0.0.1:8080, NATS on 127.0.0.1:4222, a local Postgres.
type Config struct {
	// DataDir holds the JetStream store (nats/), the local Postgres cluster
	// (postgres/) and survives restarts. Default ".data".
	DataDir string
	// HTTPAddr is where every API, the dashboard (/ui/), /healthz, /readyz
	// and /metrics are served. Default "127.0.0.1:8080" (loopback only, so
	// authentication may stay off); "127.0.0.1:0" picks a port.
	HTTPAddr string
	// Auth is how the HTTP server authenticates. Unlike the services, an
	// empty Mode is off here: the person at the machine is the only
	// caller. Off is refused on a HTTPAddr that is not loopback. With
	// tokens and no AdminToken the stack makes one (Stack.AdminToken).
	Auth auth.Config
	// TLS makes the HTTP server serve HTTPS (RETRYD_HTTP_TLS_CERT and
	// RETRYD_HTTP_TLS_KEY for retryd dev); zero serves plain HTTP.
	TLS serve.TLSConfig
	// IntakeRate and IntakeBurst limit intake per caller, as
	// ingress.Config's (RETRYD_INTAKE_RATE, RETRYD_INTAKE_BURST); zero: no
	// limit.
	IntakeRate  float64
	IntakeBurst int
	// NATSHost and NATSPort are where the embedded NATS server listens.
	// Default 127.0.0.1:4222; port -1 picks a free port. The server has
	// no users, so with authentication off NATSHost must be loopback, as
	// HTTPAddr must.
	NATSHost string
	NATSPort int
	// NATSSyncAlways makes JetStream fsync every write (sync_interval:
	// always); otherwise NATSSyncInterval (0: the server default, 2m).
	NATSSyncAlways   bool
	NATSSyncInterval time.Duration
	// DatabaseURL is the Postgres to use; empty starts a local cluster in
	// DataDir/postgres from the installed binaries (pgcluster).
	DatabaseURL string
	// PostgresBinDir holds initdb, pg_ctl and postgres for the local
	// cluster; empty searches PATH and /usr/lib/postgresql/*/bin.
	PostgresBinDir string
	// PoolConns is the size of the shared Postgres pool. Default 32.
	PoolConns int
	// Logger receives every component's logs.
	Logger zerolog.Logger
	// PostgresLog receives initdb and pg_ctl output. Default discarded.
	PostgresLog io.Writer
	// Handlers are worker handlers by job type, run by the stack's worker
	// (which also runs the worker-due-router).
	Handlers map[string]worker.Handler
	// WorkerConcurrency is how many jobs of each type run at once.
	// Default 4.
	WorkerConcurrency int
	// FetchWait bounds a pull of the worker and the jobs projection; Stop
	// waits up to this long. Default 1s.
	FetchWait time.Duration
	// SchedulerMaxIdle caps the due loop's sleep. Default 250ms.
	SchedulerMaxIdle time.Duration
}

func (c *Config) validate() error {
	if c.DataDir == "" {
		c.DataDir = DefaultDataDir
	}
	if c.HTTPAddr == "" {
		c.HTTPAddr = DefaultHTTPAddr
	}
	if c.Auth.Mode == "" {
		c.Auth.Mode = auth.ModeOff
	}
	if err := c.Auth.Validate(c.HTTPAddr); err != nil {
		return fmt.Errorf("HTTPAddr: %w", err)
	}
	if err := c.TLS.Validate(); err != nil {
		return fmt.Errorf("TLS: %w", err)
	}
	if c.NATSHost == "" {
		c.NATSHost = DefaultNATSHost
	}
	if c.NATSPort == 0 {
		c.NATSPort = DefaultNATSPort
	}
	if c.NATSPort < -1 || c.NATSPort > 65535 {
		return fmt.Errorf("Config.NATSPort must be a port or -1, got %d", c.NATSPort)
	}
	// The embedded NATS server has no users: with authentication off, it
	// is held to the HTTP listener's rule, as anyone who reaches it may
	// purge a stream or publish a forged fact.
	if err := c.Auth.Validate(c.NATSHost); err != nil {
		return fmt.Errorf("NATSHost: %w (with tokens, NATS is still open to whoever reaches it: the embedded server has no users)", err)
	}
	if c.NATSSyncInterval < 0 {
		return fmt.Errorf("Config.NATSSyncInterval must not be negative, got %s", c.NATSSyncInterval)
	}
	if c.PoolConns == 0 {
		c.PoolConns = DefaultPoolConns
	}
	if c.PoolConns < 4 || c.PoolConns > 1000 {
		return fmt.Errorf("Config.PoolConns must be between 4 and 1000, got %d", c.PoolConns)
	}
	if c.PostgresLog == nil {
		c.PostgresLog = io.Discard
	}
	if c.WorkerConcurrency == 0 {
		c.WorkerConcurrency = 4
	}
	if c.FetchWait == 0 {
		c.FetchWait = time.Second
	}
	if c.SchedulerMaxIdle == 0 {
		c.SchedulerMaxIdle = 250 * time.Millisecond
	}
	if c.FetchWait < 100*time.Millisecond {
		return errors.New("Config.FetchWait must be at least 100ms")
	}
	return nil
}
