package rabbitbroker

import (
	"context"
	"crypto/rand"
	"encoding/hex"
	"fmt"
	"os"
	"strings"
	"testing"
	"time"

	amqp "github.com/rabbitmq/amqp091-go"

	"github.com/delaybridge/delaybridge/internal/testenv"
	"github.com/delaybridge/delaybridge/pkg/config"
)

func TestMain(m *testing.M) { os.Exit(testenv.Main(m)) }

// The tests of the *_auth_test.go files run in parallel (t.Parallel): each
// has users, queues and proxies of its own, and Go runs them after the
// sequential tests, among which those that restart the shared node. Most of
// their time is waiting: RabbitMQ answers a failed login after 3 s, and each
// rabbitmqctl call boots a VM.

func randHex(n int) string {
	b := make([]byte, n)
	_, _ = rand.Read(b)
	return hex.EncodeToString(b)
}

// dial connects with a to rawURL against the real node and checks that the
// connection works (a channel opens); it returns the connection name.
func dial(t *testing.T, rawURL string, a Auth) (string, error) {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	name := "auth test " + randHex(4)
	conn, err := Dial(ctx, rawURL, name, a)
	if err != nil {
		return "", err
	}
	t.Cleanup(func() { conn.Close() })
	ch, err := conn.Channel()
	if err != nil {
		t.Fatalf("connected, but no channel: %v", err)
	}
	if _, err := ch.QueueDeclare("", false, true, true, false, nil); err != nil {
		t.Fatalf("connected, but cannot declare a queue: %v", err)
	}
	return name, nil
}

// mustFail checks that err is a dial error that contains every want and none
// of the secrets.
func mustFail(t *testing.T, err error, secrets []string, want ...string) {
	t.Helper()
	if err == nil {
		t.Fatal("connected, want an error")
	}
	msg := err.Error()
	for _, w := range want {
		if !strings.Contains(msg, w) {
			t.Errorf("error %q\ndoes not say %q", msg, w)
		}
	}
	for _, s := range secrets {
		if strings.Contains(msg, s) {
			t.Errorf("error %q\ncontains the secret %q", msg, s)
		}
	}
	t.Logf("error, as wanted: %v", err)
}

func tlsURL(node *testenv.RabbitNode, userinfo string) string {
	return fmt.Sprintf("amqps://%s@127.0.0.1:%d/", userinfo, node.TLSPort)
}

// TLS against the node's TLS listener: the right CA (and server name)
// connects; a wrong CA, a wrong server name, the system roots, TLS to the
// plain port and plain AMQP to the TLS port fail saying what to check.
func TestDialTLS(t *testing.T) {
	t.Parallel()
	node := testenv.RabbitMQ(t)
	ca := config.TLS{Enabled: true, CAFile: node.Certs.CAFile}

	t.Run("right CA", func(t *testing.T) {
		if _, err := dial(t, node.TLSURL, Auth{TLS: ca}); err != nil {
			t.Fatal(err)
		}
	})
	t.Run("server name", func(t *testing.T) {
		withName := ca
		withName.ServerName = "localhost" // the URL's host is 127.0.0.1
		if _, err := dial(t, node.TLSURL, Auth{TLS: withName}); err != nil {
			t.Fatal(err)
		}
		withName.ServerName = "broker.invalid"
		_, err := dial(t, node.TLSURL, Auth{TLS: withName})
		mustFail(t, err, nil, "not valid for \"broker.invalid\"", "tls.server_name")
	})
	t.Run("client certificate", func(t *testing.T) {
		mutual := ca
		mutual.CertFile, mutual.KeyFile = node.Certs.ClientCert, node.Certs.ClientKey
		if _, err := dial(t, node.TLSURL, Auth{TLS: mutual}); err != nil {
			t.Fatal(err)
		}
	})
	t.Run("wrong CA", func(t *testing.T) {
		other := ca
		other.CAFile = node.Certs.OtherCAFile
		_, err := dial(t, node.TLSURL, Auth{TLS: other})
		mustFail(t, err, nil, "connect to rabbitmq amqps://guest:xxxxx@127.0.0.1:", "unknown authority", "check tls.ca_file")
	})
	t.Run("system roots", func(t *testing.T) {
		// amqps:// without a tls block verifies with the system roots,
		// which do not have the test CA.
		_, err := dial(t, node.TLSURL, Auth{})
		mustFail(t, err, nil, "unknown authority", "check tls.ca_file")
	})
	t.Run("tls to the plain port", func(t *testing.T) {
		_, err := dial(t, fmt.Sprintf("amqps://guest:guest@127.0.0.1:%d/", node.Port), Auth{TLS: ca})
		mustFail(t, err, nil, "does not speak TLS")
	})
	t.Run("plain amqp to the TLS port", func(t *testing.T) {
		_, err := dial(t, fmt.Sprintf("amqp://guest:guest@127.0.0.1:%d/", node.TLSPort), Auth{})
		mustFail(t, err, nil, "whether it expects TLS (amqps://")
	})
	t.Run("tls with an amqp url", func(t *testing.T) {
		_, err := dial(t, node.URL, Auth{TLS: ca})
		mustFail(t, err, nil, "use amqps://")
	})
	t.Run("missing CA file", func(t *testing.T) {
		missing := ca
		missing.CAFile = node.Certs.Dir + "/no-such-ca.pem"
		_, err := dial(t, node.TLSURL, Auth{TLS: missing})
		mustFail(t, err, nil, "tls ca_file", "no-such-ca.pem")
	})
}

// Username and password override the URL's, over plain AMQP and TLS; a wrong
// password fails with an error that says what to check and never contains
// the password.
func TestDialCredentials(t *testing.T) {
	t.Parallel()
	node := testenv.RabbitMQ(t)
	user, password := "db-"+randHex(4), "pw-"+randHex(12)
	node.AddUser(t, user, password)
	ca := config.TLS{Enabled: true, CAFile: node.Certs.CAFile}
	wrongURLPassword := "url-pw-" + randHex(8)
	plainURL := fmt.Sprintf("amqp://guest:%s@127.0.0.1:%d/", wrongURLPassword, node.Port)
	good := Auth{Username: user, Password: config.Secret(password)}

	t.Run("override", func(t *testing.T) {
		// The URL's own credentials are wrong: only the override can work.
		if _, err := dial(t, plainURL, good); err != nil {
			t.Fatal(err)
		}
		withTLS := good
		withTLS.TLS = ca
		if _, err := dial(t, tlsURL(node, "guest:"+wrongURLPassword), withTLS); err != nil {
			t.Fatal(err)
		}
	})
	// The broker answers a failed login after 3 s: the subtests that
	// fail to log in run in parallel.
	t.Run("url credentials", func(t *testing.T) {
		t.Parallel()
		if _, err := dial(t, fmt.Sprintf("amqp://%s:%s@127.0.0.1:%d/", user, password, node.Port), Auth{}); err != nil {
			t.Fatal(err)
		}
		_, err := dial(t, plainURL, Auth{})
		mustFail(t, err, []string{wrongURLPassword}, "guest:xxxxx", "403", "check the username and password")
	})
	wrong := "wrong-" + randHex(8)
	t.Run("wrong password", func(t *testing.T) {
		t.Parallel()
		// The URL's credentials are right: the override must win.
		rightURL := fmt.Sprintf("amqp://%s:%s@127.0.0.1:%d/", user, password, node.Port)
		_, err := dial(t, rightURL, Auth{Username: user, Password: config.Secret(wrong)})
		mustFail(t, err, []string{wrong, password}, fmt.Sprintf("as user %q", user), "403", "check the username and password")
	})
	t.Run("wrong password over TLS", func(t *testing.T) {
		t.Parallel()
		withTLS := Auth{TLS: ca, Username: user, Password: config.Secret(wrong)}
		_, err := dial(t, tlsURL(node, user+":"+password), withTLS)
		mustFail(t, err, []string{wrong, password}, "amqps://127.0.0.1:", "403", "check the username and password")
	})
	t.Run("unknown vhost", func(t *testing.T) {
		t.Parallel()
		_, err := dial(t, fmt.Sprintf("amqp://127.0.0.1:%d/no-vhost-%s", node.Port, randHex(3)), good)
		mustFail(t, err, []string{password}, "check the vhost")
	})
}

// SASL EXTERNAL logs in as the client certificate's common name, whatever
// the URL says; without a client certificate, or with one from a CA the
// broker does not trust, it fails saying what to check.
func TestDialExternal(t *testing.T) {
	t.Parallel()
	node := testenv.RabbitMQ(t)
	cn := node.ExternalUser(t)
	withCert := config.TLS{Enabled: true, CAFile: node.Certs.CAFile, CertFile: node.Certs.ClientCert, KeyFile: node.Certs.ClientKey}
	// guest with a wrong password: the URL's credentials must not be used.
	url := tlsURL(node, "guest:not-the-password")

	t.Run("client certificate", func(t *testing.T) {
		name, err := dial(t, url, Auth{TLS: withCert, External: true})
		if err != nil {
			t.Fatal(err)
		}
		// The broker says who the connection is.
		out := node.Ctl(t, "list_connections", "--quiet", "user", "client_properties")
		var found bool
		for line := range strings.SplitSeq(out, "\n") {
			if strings.Contains(line, name) {
				found = true
				if user, _, _ := strings.Cut(line, "\t"); user != cn {
					t.Errorf("connection %q logged in as %q, want %q", name, user, cn)
				}
			}
		}
		if !found {
			t.Errorf("connection %q not in list_connections:\n%s", name, out)
		}
	})
	t.Run("no client certificate", func(t *testing.T) {
		t.Parallel() // a failed login is answered after 3 s
		noCert := withCert
		noCert.CertFile, noCert.KeyFile = "", ""
		_, err := dial(t, url, Auth{TLS: noCert, External: true})
		mustFail(t, err, nil, "with SASL EXTERNAL", "403", "check that one is configured (tls.cert_file")
	})
	t.Run("certificate from another CA", func(t *testing.T) {
		other := testenv.NewCerts(t, cn) // same name, CA unknown to the broker
		untrusted := withCert
		untrusted.CertFile, untrusted.KeyFile = other.ClientCert, other.ClientKey
		_, err := dial(t, url, Auth{TLS: untrusted, External: true})
		// The broker's alert (unknown certificate authority) or, with TLS
		// 1.3, the connection it closed, whichever the client sees first.
		mustFail(t, err, nil, "with SASL EXTERNAL", "check tls.cert_file and tls.key_file (a client certificate signed by a CA the broker trusts")
	})
	t.Run("amqp url", func(t *testing.T) {
		_, err := dial(t, node.URL, Auth{External: true})
		mustFail(t, err, nil, "SASL EXTERNAL", "amqps://")
	})
}

// A refused connection says where and what to check.
func TestDialRefused(t *testing.T) {
	t.Parallel()
	port := testenv.FreePort(t) // reserved, nothing listens
	_, err := dial(t, fmt.Sprintf("amqps://u:secret-pw@127.0.0.1:%d/", port), Auth{})
	mustFail(t, err, []string{"secret-pw"}, "connection refused", fmt.Sprintf("nothing accepts connections at 127.0.0.1:%d", port))
}

// DialConfig never puts a password into an error, even for a URL that does
// not parse.
func TestDialConfigErrors(t *testing.T) {
	t.Parallel()
	for _, u := range []string{"amqp://u:p%zzsecret@h/", "http://u:secret@h/", "amqp://u:sec ret@h/"} {
		_, _, err := DialConfig(u, Auth{})
		if err == nil || strings.Contains(err.Error(), "secret") || strings.Contains(err.Error(), "sec ret") {
			t.Errorf("DialConfig(%q): %v", u, err)
		}
	}
	_, cfg, err := DialConfig("amqp://guest:guest@h/", Auth{Username: "u", Password: "p"})
	if err != nil || len(cfg.SASL) != 1 || cfg.SASL[0].Mechanism() != "PLAIN" {
		t.Errorf("override: %v %v", cfg.SASL, err)
	}
	if s := fmt.Sprint(cfg.SASL); strings.Contains(s, "\x00p") {
		t.Errorf("the config prints the password: %s", s)
	}
	_, cfg, err = DialConfig("amqps://h/", Auth{TLS: config.TLS{Enabled: true}, External: true})
	if err != nil || len(cfg.SASL) != 1 || cfg.SASL[0].Mechanism() != "EXTERNAL" || cfg.TLSClientConfig.ServerName != "h" {
		t.Errorf("external: %v %v", cfg, err)
	}
	var _ amqp.Authentication = cfg.SASL[0]
}
