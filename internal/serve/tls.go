package serve

import (
	"crypto/tls"
	"crypto/x509"
	"fmt"
	"os"
)

// The variables that turn HTTPS on for every listener of a binary.
const (
	EnvTLSCert = "RETRYD_HTTP_TLS_CERT"
	EnvTLSKey  = "RETRYD_HTTP_TLS_KEY"
)

// TLSConfig is the HTTPS setting of a binary's HTTP listeners: a PEM
// certificate (chain) and its key. Both empty serves plain HTTP.
type TLSConfig struct {
	CertFile string
	KeyFile  string
}

// TLSFromEnv reads RETRYD_HTTP_TLS_CERT and RETRYD_HTTP_TLS_KEY.
func TLSFromEnv() TLSConfig {
	return TLSConfig{CertFile: os.Getenv(EnvTLSCert), KeyFile: os.Getenv(EnvTLSKey)}
}

// Enabled reports whether HTTPS is configured.
func (c TLSConfig) Enabled() bool { return c.CertFile != "" || c.KeyFile != "" }

// Validate refuses half a configuration: a certificate without its key
// (or the reverse) would otherwise serve plain HTTP where HTTPS was meant.
func (c TLSConfig) Validate() error {
	switch {
	case c.CertFile != "" && c.KeyFile == "":
		return fmt.Errorf("%s is set but %s is not: set both (PEM files) or neither", EnvTLSCert, EnvTLSKey)
	case c.CertFile == "" && c.KeyFile != "":
		return fmt.Errorf("%s is set but %s is not: set both (PEM files) or neither", EnvTLSKey, EnvTLSCert)
	}
	return nil
}

// Server returns the *tls.Config to put in an http.Server's TLSConfig, or
// nil when HTTPS is not configured. It loads the key pair now, so a bad
// file stops the binary at start rather than at the first handshake.
// TLS 1.0 and 1.1 are refused.
func (c TLSConfig) Server() (*tls.Config, error) {
	if err := c.Validate(); err != nil {
		return nil, err
	}
	if !c.Enabled() {
		return nil, nil
	}
	cert, err := tls.LoadX509KeyPair(c.CertFile, c.KeyFile)
	if err != nil {
		return nil, fmt.Errorf("load %s and %s: %w", EnvTLSCert, EnvTLSKey, err)
	}
	return &tls.Config{MinVersion: tls.VersionTLS12, Certificates: []tls.Certificate{cert}}, nil
}

// Scheme is "https" when HTTPS is configured, else "http", for banners
// and logs.
func (c TLSConfig) Scheme() string {
	if c.Enabled() {
		return "https"
	}
	return "http"
}

// EnvCAFile names a PEM file of CAs that clients of retryd's HTTPS
// listeners trust besides the system's: the CLI (--ca-file) and the
// gateway, towards the services behind it.
const EnvCAFile = "RETRYD_CA_FILE"

// ClientTLS returns a client *tls.Config trusting the system's CAs and
// those of the PEM files given (empty names are skipped), or nil when no
// file is given, so the default transport stays in use.
func ClientTLS(caFiles ...string) (*tls.Config, error) {
	var pool *x509.CertPool
	for _, f := range caFiles {
		if f == "" {
			continue
		}
		if pool == nil {
			var err error
			if pool, err = x509.SystemCertPool(); err != nil {
				pool = x509.NewCertPool()
			}
		}
		b, err := os.ReadFile(f)
		if err != nil {
			return nil, fmt.Errorf("read CA file: %w", err)
		}
		if !pool.AppendCertsFromPEM(b) {
			return nil, fmt.Errorf("read CA file %s: no PEM certificate in it", f)
		}
	}
	if pool == nil {
		return nil, nil
	}
	return &tls.Config{MinVersion: tls.VersionTLS12, RootCAs: pool}, nil
}
