package daemon_test

import (
	"context"
	"fmt"
	"strings"
	"testing"

	"github.com/delaybridge/delaybridge/internal/testenv"
	"github.com/delaybridge/delaybridge/pkg/config"
	"github.com/delaybridge/delaybridge/pkg/daemon"
)

// Redis over TLS with mutual authentication and an ACL user: the store
// connects with the right settings, and each wrong one gives a clear error.
func TestRedisTLSAndACL(t *testing.T) {
	certs := testenv.NewCerts(t, "delaybridge")
	tlsPort := testenv.FreePort(t)
	testenv.Redis(t, testenv.WithArgs(
		"--tls-port", fmt.Sprint(tlsPort),
		"--tls-cert-file", certs.ServerCert, "--tls-key-file", certs.ServerKey,
		"--tls-ca-cert-file", certs.CAFile, "--tls-auth-clients", "yes",
		// The ACL user; the default user stays for testenv's plain-port
		// readiness probe, and the tests below use the TLS port.
		"--user", "delaybridge", "on", ">"+secret, "~*", "&*", "+@all",
	))
	open := func(redisYAML string) error {
		cfg, err := config.Parse([]byte(fmt.Sprintf(`
redis: {addr: "127.0.0.1:%d", dial_timeout: 2s, %s}
sinks: [{name: s, nats: {url: "nats://127.0.0.1:1"}}]
`, tlsPort, redisYAML)), func(string) (string, bool) { return "", false })
		if err != nil {
			t.Fatal(err)
		}
		st, err := daemon.OpenStore(context.Background(), cfg, nil)
		if err != nil {
			return err
		}
		defer st.Client().Close()
		return st.CheckShards(context.Background())
	}
	good := fmt.Sprintf(`username: delaybridge, password: %q, tls: {enabled: true, ca_file: %q, cert_file: %q, key_file: %q}`,
		secret, certs.CAFile, certs.ClientCert, certs.ClientKey)
	if err := open(good); err != nil {
		t.Fatalf("right settings: %v", err)
	}
	for name, c := range map[string]struct{ yaml, want string }{
		"wrong password": {strings.Replace(good, secret, "nope", 1), "WRONGPASS"},
		"unknown CA": {fmt.Sprintf(`username: delaybridge, password: %q, tls: {enabled: true, ca_file: %q, cert_file: %q, key_file: %q}`,
			secret, certs.OtherCAFile, certs.ClientCert, certs.ClientKey), "certificate"},
		"no client certificate": {fmt.Sprintf(`username: delaybridge, password: %q, tls: {enabled: true, ca_file: %q}`,
			secret, certs.CAFile), ""},
		"no TLS": {fmt.Sprintf(`username: delaybridge, password: %q`, secret), ""},
	} {
		err := open(c.yaml)
		if err == nil {
			t.Errorf("%s: connected", name)
			continue
		}
		if !strings.Contains(err.Error(), c.want) || !strings.Contains(err.Error(), "credentials and TLS settings") {
			t.Errorf("%s: error %q does not say why (want %q) and what to check", name, err, c.want)
		}
		if strings.Contains(err.Error(), secret) {
			t.Errorf("%s: the password is in the error: %v", name, err)
		}
	}
}

const secret = "pw-4f1c-not-for-logs"
