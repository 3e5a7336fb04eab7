// Package devcerts writes a throwaway certificate authority and a server
// certificate signed by it, for the NATS TLS of docker-compose and of
// tests. Production certificates come from your PKI (cert-manager, Vault).
package devcerts

import (
	"crypto/ecdsa"
	"crypto/elliptic"
	"crypto/rand"
	"crypto/x509"
	"crypto/x509/pkix"
	"encoding/pem"
	"errors"
	"fmt"
	"math/big"
	"net"
	"os"
	"path/filepath"
	"time"
)

// File names, as Kubernetes TLS secrets name them.
const (
	CAFile   = "ca.crt"
	CertFile = "tls.crt"
	KeyFile  = "tls.key"
)

// Files are the paths Generate wrote.
type Files struct {
	CA, Cert, Key string
}

// Generate writes ca.crt, tls.crt and tls.key into dir for the given host
// names and IP addresses, valid for validity. With keep, existing files are
// left alone (so a restarted compose job does not rotate them).
func Generate(dir string, hosts []string, validity time.Duration, keep bool) (Files, bool, error) {
	f := Files{CA: filepath.Join(dir, CAFile), Cert: filepath.Join(dir, CertFile), Key: filepath.Join(dir, KeyFile)}
	if keep && exists(f.CA) && exists(f.Cert) && exists(f.Key) {
		return f, false, nil
	}
	if len(hosts) == 0 {
		return Files{}, false, errors.New("generate certificates: no host names")
	}
	if err := os.MkdirAll(dir, 0o755); err != nil {
		return Files{}, false, fmt.Errorf("generate certificates: %w", err)
	}
	now := time.Now()
	caKey, err := ecdsa.GenerateKey(elliptic.P256(), rand.Reader)
	if err != nil {
		return Files{}, false, fmt.Errorf("generate CA key: %w", err)
	}
	caTmpl := &x509.Certificate{
		SerialNumber:          serial(),
		Subject:               pkix.Name{CommonName: "retryd development CA"},
		NotBefore:             now.Add(-time.Hour),
		NotAfter:              now.Add(validity),
		KeyUsage:              x509.KeyUsageCertSign | x509.KeyUsageCRLSign,
		BasicConstraintsValid: true,
		IsCA:                  true,
	}
	caDER, err := x509.CreateCertificate(rand.Reader, caTmpl, caTmpl, &caKey.PublicKey, caKey)
	if err != nil {
		return Files{}, false, fmt.Errorf("sign CA certificate: %w", err)
	}
	ca, err := x509.ParseCertificate(caDER)
	if err != nil {
		return Files{}, false, fmt.Errorf("parse CA certificate: %w", err)
	}
	key, err := ecdsa.GenerateKey(elliptic.P256(), rand.Reader)
	if err != nil {
		return Files{}, false, fmt.Errorf("generate server key: %w", err)
	}
	tmpl := &x509.Certificate{
		SerialNumber: serial(),
		Subject:      pkix.Name{CommonName: hosts[0]},
		NotBefore:    now.Add(-time.Hour),
		NotAfter:     now.Add(validity),
		KeyUsage:     x509.KeyUsageDigitalSignature,
		ExtKeyUsage:  []x509.ExtKeyUsage{x509.ExtKeyUsageServerAuth, x509.ExtKeyUsageClientAuth},
	}
	for _, h := range hosts {
		if ip := net.ParseIP(h); ip != nil {
			tmpl.IPAddresses = append(tmpl.IPAddresses, ip)
		} else {
			tmpl.DNSNames = append(tmpl.DNSNames, h)
		}
	}
	der, err := x509.CreateCertificate(rand.Reader, tmpl, ca, &key.PublicKey, caKey)
	if err != nil {
		return Files{}, false, fmt.Errorf("sign server certificate: %w", err)
	}
	keyDER, err := x509.MarshalPKCS8PrivateKey(key)
	if err != nil {
		return Files{}, false, fmt.Errorf("encode server key: %w", err)
	}
	for _, w := range []struct {
		path, typ string
		der       []byte
		mode      os.FileMode
	}{
		{f.CA, "CERTIFICATE", caDER, 0o644},
		{f.Cert, "CERTIFICATE", der, 0o644},
		{f.Key, "PRIVATE KEY", keyDER, 0o600},
	} {
		data := pem.EncodeToMemory(&pem.Block{Type: w.typ, Bytes: w.der})
		if err := os.WriteFile(w.path, data, w.mode); err != nil {
			return Files{}, false, fmt.Errorf("write %s: %w", w.path, err)
		}
	}
	return f, true, nil
}

func serial() *big.Int {
	n, err := rand.Int(rand.Reader, new(big.Int).Lsh(big.NewInt(1), 127))
	if err != nil {
		panic(err) // crypto/rand does not fail on supported platforms
	}
	return n
}

func exists(path string) bool {
	_, err := os.Stat(path)
	return err == nil
}
