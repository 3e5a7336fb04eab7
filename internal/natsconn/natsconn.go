// Package natsconn connects retryd services to NATS from environment
// variables: URL, credentials (creds file, nkey seed, user and password or
// token) and TLS, with reconnects that never give up.
//
//	opts := natsconn.OptionsFromEnv("retryd-scheduler")
//	nc, js, err := natsconn.Connect(ctx, opts, log)
//
// Secrets never reach the logs: URLs are logged without their user
// information and credentials are not logged at all.
package natsconn

import (
	"context"
	"crypto/tls"
	"crypto/x509"
	"errors"
	"fmt"
	"io"
	"net"
	"net/url"
	"os"
	"strings"
	"syscall"
	"time"

	"github.com/nats-io/jwt/v2"
	"github.com/nats-io/nats.go"
	"github.com/nats-io/nats.go/jetstream"
	"github.com/rs/zerolog"
)

// DefaultURL is used when NATS_URL is not set.
const DefaultURL = "nats://127.0.0.1:4222"

// Environment variables read by OptionsFromEnv.
const (
	EnvURL         = "NATS_URL"
	EnvCreds       = "NATS_CREDS"
	EnvNKey        = "NATS_NKEY"
	EnvUser        = "NATS_USER"
	EnvPassword    = "NATS_PASSWORD"
	EnvToken       = "NATS_TOKEN"
	EnvTLSCert     = "NATS_TLS_CERT"
	EnvTLSKey      = "NATS_TLS_KEY"
	EnvTLSCA       = "NATS_TLS_CA"
	EnvInboxPrefix = "NATS_INBOX_PREFIX"
	retryWaitStart = 100 * time.Millisecond
	retryWaitMax   = 5 * time.Second
)

// Options says where and how to connect. At most one way of
// authenticating may be set: CredsFile, NKeyFile, User and Password, or
// Token.
type Options struct {
	// URL is one server URL or a comma-separated list (NATS_URL).
	URL string
	// Name is the connection name shown by `nats server report
	// connections`, e.g. "retryd-scheduler".
	Name string
	// CredsFile is a .creds file with a user JWT and nkey seed (NATS_CREDS).
	CredsFile string
	// NKeyFile is a file holding a user nkey seed (NATS_NKEY).
	NKeyFile string
	// User and Password authenticate with a user name (NATS_USER,
	// NATS_PASSWORD).
	User, Password string
	// Token authenticates with a token (NATS_TOKEN).
	Token string
	// TLSCert and TLSKey are a client certificate and key in PEM files
	// (NATS_TLS_CERT, NATS_TLS_KEY), for servers that verify clients.
	TLSCert, TLSKey string
	// TLSCA is a PEM file of the CAs to trust for the server certificate
	// (NATS_TLS_CA); setting it turns TLS on.
	TLSCA string
	// InboxPrefix replaces "_INBOX" in the subjects where replies, PubAcks
	// and pulled messages arrive (NATS_INBOX_PREFIX). Give each user its
	// own, e.g. "_INBOX_scheduler", and allow it to subscribe to that
	// prefix only: then no user can read another's replies (a worker's
	// pulled job payloads, say).
	InboxPrefix string
}

// OptionsFromEnv reads the NATS_* variables; name becomes the connection
// name.
func OptionsFromEnv(name string) Options {
	o := Options{
		URL:       os.Getenv(EnvURL),
		Name:      name,
		CredsFile: os.Getenv(EnvCreds),
		NKeyFile:  os.Getenv(EnvNKey),
		User:      os.Getenv(EnvUser),
		Password:  os.Getenv(EnvPassword),
		Token:     os.Getenv(EnvToken),
		TLSCert:   os.Getenv(EnvTLSCert),
		TLSKey:    os.Getenv(EnvTLSKey),
		TLSCA:     os.Getenv(EnvTLSCA),

		InboxPrefix: os.Getenv(EnvInboxPrefix),
	}
	if o.URL == "" {
		o.URL = DefaultURL
	}
	return o
}

// Validate checks the options without connecting; errors name the option
// and its environment variable, never a secret.
func (o Options) Validate() error {
	if strings.TrimSpace(o.URL) == "" {
		return errors.New("Options.URL (NATS_URL) is required")
	}
	methods := 0
	for _, set := range []bool{o.CredsFile != "", o.NKeyFile != "", o.User != "" || o.Password != "", o.Token != ""} {
		if set {
			methods++
		}
	}
	if methods > 1 {
		return errors.New("set only one of Options.CredsFile (NATS_CREDS), Options.NKeyFile (NATS_NKEY), Options.User/Password (NATS_USER/NATS_PASSWORD) and Options.Token (NATS_TOKEN)")
	}
	if (o.User == "") != (o.Password == "") {
		return errors.New("Options.User (NATS_USER) and Options.Password (NATS_PASSWORD) go together")
	}
	if p := o.InboxPrefix; p != "" && (strings.ContainsAny(p, " \t\r\n*>") || strings.HasPrefix(p, ".") || strings.HasSuffix(p, ".") || strings.Contains(p, "..")) {
		return fmt.Errorf("Options.InboxPrefix (NATS_INBOX_PREFIX) %q must be a subject without wildcards, such as _INBOX_scheduler", p)
	}
	if (o.TLSCert == "") != (o.TLSKey == "") {
		return errors.New("Options.TLSCert (NATS_TLS_CERT) and Options.TLSKey (NATS_TLS_KEY) go together")
	}
	if o.CredsFile != "" {
		if err := checkCreds(o.CredsFile); err != nil {
			return fmt.Errorf("Options.CredsFile (NATS_CREDS) %s: %w", o.CredsFile, err)
		}
	}
	if o.NKeyFile != "" {
		if _, err := nats.NkeyOptionFromSeed(o.NKeyFile); err != nil {
			return fmt.Errorf("Options.NKeyFile (NATS_NKEY) %s: %w", o.NKeyFile, err)
		}
	}
	if o.TLSCA != "" {
		pem, err := os.ReadFile(o.TLSCA)
		if err != nil {
			return fmt.Errorf("Options.TLSCA (NATS_TLS_CA): %w", err)
		}
		if !x509.NewCertPool().AppendCertsFromPEM(pem) {
			return fmt.Errorf("Options.TLSCA (NATS_TLS_CA) %s: no PEM certificate found", o.TLSCA)
		}
	}
	if o.TLSCert != "" {
		if _, err := tls.LoadX509KeyPair(o.TLSCert, o.TLSKey); err != nil {
			return fmt.Errorf("Options.TLSCert/TLSKey (NATS_TLS_CERT/NATS_TLS_KEY): %w", err)
		}
	}
	return nil
}

// checkCreds reads a creds file the way the client will, so that a wrong
// path or a file that is not a creds file fails at start with its name
// instead of as an authorization error later.
func checkCreds(path string) error {
	contents, err := os.ReadFile(path)
	if err != nil {
		return err
	}
	token, err := jwt.ParseDecoratedJWT(contents)
	if err == nil {
		_, err = jwt.DecodeUserClaims(token)
	}
	if err != nil {
		return fmt.Errorf("no user JWT found (is it a .creds file?): %w", err)
	}
	kp, err := jwt.ParseDecoratedNKey(contents)
	if err != nil {
		return fmt.Errorf("no nkey seed found (is it a .creds file?): %w", err)
	}
	kp.Wipe()
	return nil
}

// natsOptions turns o into client options.
func (o Options) natsOptions(log zerolog.Logger) ([]nats.Option, error) {
	opts := []nats.Option{
		nats.Name(o.Name),
		nats.MaxReconnects(-1),
		nats.ReconnectWait(time.Second),
		nats.Timeout(5 * time.Second),
		nats.DisconnectErrHandler(func(nc *nats.Conn, err error) {
			ev := log.Warn().Str("server", nc.ConnectedUrlRedacted())
			if err != nil {
				ev = ev.Err(err)
			}
			ev.Msg("nats disconnected, reconnecting")
		}),
		nats.ReconnectHandler(func(nc *nats.Conn) {
			log.Info().Str("server", nc.ConnectedUrlRedacted()).Uint64("reconnects", nc.Reconnects).Msg("nats reconnected")
		}),
		nats.ClosedHandler(func(*nats.Conn) {
			log.Info().Msg("nats connection closed")
		}),
		nats.ErrorHandler(func(_ *nats.Conn, sub *nats.Subscription, err error) {
			ev := log.Error().Err(err)
			if sub != nil {
				ev = ev.Str("subject", sub.Subject)
			}
			ev.Msg("nats async error")
		}),
	}
	switch {
	case o.CredsFile != "":
		opts = append(opts, nats.UserCredentials(o.CredsFile))
	case o.NKeyFile != "":
		opt, err := nats.NkeyOptionFromSeed(o.NKeyFile)
		if err != nil {
			return nil, fmt.Errorf("Options.NKeyFile (NATS_NKEY) %s: %w", o.NKeyFile, err)
		}
		opts = append(opts, opt)
	case o.User != "":
		opts = append(opts, nats.UserInfo(o.User, o.Password))
	case o.Token != "":
		opts = append(opts, nats.Token(o.Token))
	}
	if o.TLSCA != "" {
		opts = append(opts, nats.RootCAs(o.TLSCA))
	}
	if o.InboxPrefix != "" {
		opts = append(opts, nats.CustomInboxPrefix(o.InboxPrefix))
	}
	if o.TLSCert != "" {
		opts = append(opts, nats.ClientCert(o.TLSCert, o.TLSKey))
	}
	return opts, nil
}

// Connect connects to NATS and returns the connection and its JetStream
// context. While no server can be reached at all it keeps trying, with
// growing waits up to 5 seconds, until ctx is done, so services may start
// before NATS; errors that waiting cannot fix (bad credentials, an
// untrusted certificate, a malformed option) return at once. Once
// connected, the client reconnects forever and logs each disconnect and
// reconnect.
func Connect(ctx context.Context, o Options, log zerolog.Logger) (*nats.Conn, jetstream.JetStream, error) {
	if err := o.Validate(); err != nil {
		return nil, nil, fmt.Errorf("connect to nats: %w", err)
	}
	opts, err := o.natsOptions(log)
	if err != nil {
		return nil, nil, fmt.Errorf("connect to nats: %w", err)
	}
	servers := RedactURL(o.URL)
	wait := retryWaitStart
	for {
		nc, err := nats.Connect(o.URL, opts...)
		if err == nil {
			js, err := jetstream.New(nc)
			if err != nil {
				nc.Close()
				return nil, nil, fmt.Errorf("connect to nats: new jetstream: %w", err)
			}
			log.Info().Str("server", nc.ConnectedUrlRedacted()).Str("name", o.Name).Msg("nats connected")
			return nc, js, nil
		}
		if !transient(err) {
			return nil, nil, fmt.Errorf("connect to nats %s: %w", servers, err)
		}
		log.Warn().Err(err).Str("servers", servers).Dur("retry_in", wait).Msg("nats not reachable, retrying")
		select {
		case <-ctx.Done():
			return nil, nil, fmt.Errorf("connect to nats %s: %w (gave up: %w)", servers, err, ctx.Err())
		case <-time.After(wait):
		}
		wait = min(2*wait, retryWaitMax)
	}
}

// transient reports whether a failed connect may work later: no server
// answered, or the connection broke before the handshake finished.
func transient(err error) bool {
	var netErr net.Error
	switch {
	case errors.Is(err, nats.ErrNoServers),
		errors.Is(err, syscall.ECONNREFUSED),
		errors.Is(err, syscall.ECONNRESET),
		errors.Is(err, io.EOF),
		errors.Is(err, nats.ErrTimeout):
		return true
	case errors.As(err, &netErr) && netErr.Timeout():
		return true
	}
	return false
}

// RedactURL returns a server URL list with user names, passwords and
// tokens removed, safe to log.
func RedactURL(urls string) string {
	parts := strings.Split(urls, ",")
	for i, p := range parts {
		p = strings.TrimSpace(p)
		u, err := url.Parse(p)
		if err != nil || u.Host == "" {
			// Not a URL we can take apart: keep only what follows an '@'.
			if at := strings.LastIndex(p, "@"); at >= 0 {
				p = "redacted@" + p[at+1:]
			}
			parts[i] = p
			continue
		}
		if u.User != nil {
			u.User = url.User("redacted")
		}
		parts[i] = u.String()
	}
	return strings.Join(parts, ",")
}

// WithRefusals returns a context that also ends when the server refuses
// a publish or a subscription of nc as a permissions violation, with the
// violation as its cause. The server answers a refused JetStream API
// request with no reply, only an asynchronous -ERR; without this the
// request waits out its timeout and reports a deadline. It suits a
// connection doing one thing at a time, such as the CLI's: any refusal
// ends the context. The connection's error handler keeps being called;
// cancel restores it alone. Refused turns the request's error into the
// refusal.
func WithRefusals(ctx context.Context, nc *nats.Conn) (context.Context, context.CancelFunc) {
	ctx, cancel := context.WithCancelCause(ctx)
	prev := nc.ErrorHandler()
	nc.SetErrorHandler(func(c *nats.Conn, sub *nats.Subscription, err error) {
		if errors.Is(err, nats.ErrPermissionViolation) {
			cancel(err)
		}
		if prev != nil {
			prev(c, sub, err)
		}
	})
	return ctx, func() {
		nc.SetErrorHandler(prev)
		cancel(context.Canceled)
	}
}

// Refused returns err, or in its place the permissions violation that
// ended ctx (a context of WithRefusals): the reason a request failed,
// rather than the timeout it became.
func Refused(ctx context.Context, err error) error {
	if err == nil {
		return nil
	}
	if cause := context.Cause(ctx); errors.Is(cause, nats.ErrPermissionViolation) {
		return fmt.Errorf("refused by the NATS server, the user lacks the permission: %w", cause)
	}
	return err
}
