package testenv

import (
	"crypto/ecdsa"
	"crypto/elliptic"
	"crypto/rand"
	"crypto/tls"
	"crypto/x509"
	"crypto/x509/pkix"
	"encoding/pem"
	"math/big"
	"net"
	"os"
	"path/filepath"
	"testing"
	"time"
)

// Certs is a throwaway PKI for TLS tests: a CA, a server certificate for
// 127.0.0.1 and localhost, and a client certificate, as PEM files in a temp
// dir (RSA-free: ECDSA P-256, valid for a day).
type Certs struct {
	Dir        string
	CAFile     string // CA certificate
	ServerCert string // server certificate, signed by the CA
	ServerKey  string
	ClientCert string // client certificate (CN = ClientCN), signed by the CA
	ClientKey  string
	ClientCN   string

	// OtherCAFile is a CA that signed nothing here: verifying the server
	// with it must fail.
	OtherCAFile string

	ca *x509.Certificate
}

// NewCerts creates the PKI in t.TempDir(). The client certificate's common
// name is clientCN (RabbitMQ's EXTERNAL mechanism maps it to a user).
func NewCerts(t testing.TB, clientCN string) *Certs {
	t.Helper()
	dir := t.TempDir()
	c := &Certs{Dir: dir, ClientCN: clientCN}
	caKey, caCert := c.newCA(t, "delaybridge test CA")
	c.ca = caCert
	c.CAFile = writePEM(t, dir, "ca.pem", "CERTIFICATE", caCert.Raw)
	_, other := c.newCA(t, "unrelated CA")
	c.OtherCAFile = writePEM(t, dir, "other-ca.pem", "CERTIFICATE", other.Raw)

	c.ServerCert, c.ServerKey = c.issue(t, caKey, "server", &x509.Certificate{
		Subject:     pkix.Name{CommonName: "localhost"},
		DNSNames:    []string{"localhost"},
		IPAddresses: []net.IP{net.ParseIP("127.0.0.1")},
		ExtKeyUsage: []x509.ExtKeyUsage{x509.ExtKeyUsageServerAuth},
	})
	c.ClientCert, c.ClientKey = c.issue(t, caKey, "client", &x509.Certificate{
		Subject:     pkix.Name{CommonName: clientCN},
		ExtKeyUsage: []x509.ExtKeyUsage{x509.ExtKeyUsageClientAuth},
	})
	return c
}

// ServerTLS is a server-side *tls.Config with the server certificate;
// requireClient makes it demand a client certificate signed by the CA.
func (c *Certs) ServerTLS(t testing.TB, requireClient bool) *tls.Config {
	t.Helper()
	cert, err := tls.LoadX509KeyPair(c.ServerCert, c.ServerKey)
	if err != nil {
		t.Fatalf("testenv: certs: %v", err)
	}
	cfg := &tls.Config{Certificates: []tls.Certificate{cert}, MinVersion: tls.VersionTLS12}
	if requireClient {
		pool := x509.NewCertPool()
		pool.AddCert(c.ca)
		cfg.ClientCAs = pool
		cfg.ClientAuth = tls.RequireAndVerifyClientCert
	}
	return cfg
}

func (c *Certs) newCA(t testing.TB, name string) (*ecdsa.PrivateKey, *x509.Certificate) {
	t.Helper()
	key, err := ecdsa.GenerateKey(elliptic.P256(), rand.Reader)
	if err != nil {
		t.Fatalf("testenv: certs: %v", err)
	}
	tmpl := &x509.Certificate{
		SerialNumber:          serial(t),
		Subject:               pkix.Name{CommonName: name},
		NotBefore:             time.Now().Add(-time.Hour),
		NotAfter:              time.Now().Add(24 * time.Hour),
		IsCA:                  true,
		BasicConstraintsValid: true,
		KeyUsage:              x509.KeyUsageCertSign | x509.KeyUsageDigitalSignature,
	}
	der, err := x509.CreateCertificate(rand.Reader, tmpl, tmpl, &key.PublicKey, key)
	if err != nil {
		t.Fatalf("testenv: certs: %v", err)
	}
	cert, _ := x509.ParseCertificate(der)
	return key, cert
}

func (c *Certs) issue(t testing.TB, caKey *ecdsa.PrivateKey, name string, tmpl *x509.Certificate) (certFile, keyFile string) {
	t.Helper()
	key, err := ecdsa.GenerateKey(elliptic.P256(), rand.Reader)
	if err != nil {
		t.Fatalf("testenv: certs: %v", err)
	}
	tmpl.SerialNumber = serial(t)
	tmpl.NotBefore = time.Now().Add(-time.Hour)
	tmpl.NotAfter = time.Now().Add(24 * time.Hour)
	tmpl.KeyUsage = x509.KeyUsageDigitalSignature | x509.KeyUsageKeyEncipherment
	der, err := x509.CreateCertificate(rand.Reader, tmpl, c.ca, &key.PublicKey, caKey)
	if err != nil {
		t.Fatalf("testenv: certs: %v", err)
	}
	kder, err := x509.MarshalECPrivateKey(key)
	if err != nil {
		t.Fatalf("testenv: certs: %v", err)
	}
	return writePEM(t, c.Dir, name+".pem", "CERTIFICATE", der), writePEM(t, c.Dir, name+"-key.pem", "EC PRIVATE KEY", kder)
}

func serial(t testing.TB) *big.Int {
	n, err := rand.Int(rand.Reader, new(big.Int).Lsh(big.NewInt(1), 62))
	if err != nil {
		t.Fatalf("testenv: certs: %v", err)
	}
	return n
}

func writePEM(t testing.TB, dir, name, typ string, der []byte) string {
	t.Helper()
	path := filepath.Join(dir, name)
	if err := os.WriteFile(path, pem.EncodeToMemory(&pem.Block{Type: typ, Bytes: der}), 0o600); err != nil {
		t.Fatalf("testenv: certs: %v", err)
	}
	return path
}
