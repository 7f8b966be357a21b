package rabbitbroker_test

import (
	"context"
	"fmt"
	"strings"
	"testing"
	"time"

	"github.com/delaybridge/delaybridge/internal/testenv"
	"github.com/delaybridge/delaybridge/pkg/brokers/rabbitbroker"
	"github.com/delaybridge/delaybridge/pkg/config"
	"github.com/delaybridge/delaybridge/pkg/sinks"
)

func newAuthSink(t testing.TB, url string, auth rabbitbroker.Auth) (*rabbitbroker.Sink, error) {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	s, err := rabbitbroker.NewSink(ctx, rabbitbroker.SinkParams{Name: "auth", URL: url, Mandatory: true, Auth: auth}, quiet)
	if err != nil {
		return nil, err
	}
	t.Cleanup(func() { _ = s.Close() })
	return s, nil
}

// publishes connects a sink with url and auth, publishes a message through
// the default exchange to a fresh queue and checks, on the plain listener as
// guest, that it arrived.
func publishes(t *testing.T, node *testenv.RabbitNode, url string, auth rabbitbroker.Auth) {
	t.Helper()
	a := newAdmin(t, node.URL)
	q := a.queue(unique(t))
	s, err := newAuthSink(t, url, auth)
	if err != nil {
		t.Fatalf("New: %v", err)
	}
	if err := s.Ready(); err != nil {
		t.Fatalf("Ready: %v", err)
	}
	id := "m-" + randHex(4)
	noErrors(t, publish(t, s, []sinks.Outgoing{msg(id, q)}))
	if d := a.get(q); d.MessageId != id || string(d.Body) != "body of "+id {
		t.Fatalf("got %q %q, want %s", d.MessageId, d.Body, id)
	}
}

// wantErr checks that err says every want and contains no secret.
// The sink over amqps: the right CA works; a wrong CA fails at New, saying
// to check tls.ca_file.
func TestSinkAuthTLS(t *testing.T) {
	t.Parallel()
	node := testenv.RabbitMQ(t)
	ca := config.TLS{Enabled: true, CAFile: node.Certs.CAFile}
	t.Run("right CA", func(t *testing.T) {
		publishes(t, node, node.TLSURL, rabbitbroker.Auth{TLS: ca})
	})
	t.Run("right CA, server name, client certificate", func(t *testing.T) {
		mutual := ca
		mutual.ServerName = "localhost"
		mutual.CertFile, mutual.KeyFile = node.Certs.ClientCert, node.Certs.ClientKey
		publishes(t, node, node.TLSURL, rabbitbroker.Auth{TLS: mutual})
	})
	t.Run("wrong CA", func(t *testing.T) {
		wrong := rabbitbroker.Auth{TLS: config.TLS{Enabled: true, CAFile: node.Certs.OtherCAFile}}
		_, err := newAuthSink(t, node.TLSURL, wrong)
		wantErr(t, err, nil, "rabbitmq sink auth", "certificate signed by unknown authority", "check tls.ca_file")
	})
}

// Username and password override the URL's; a wrong password fails at New
// with an error without it that says what to check.
func TestSinkAuthCredentials(t *testing.T) {
	t.Parallel()
	node := testenv.RabbitMQ(t)
	user, password := "sink-"+randHex(4), "pw-"+randHex(12)
	node.AddUser(t, user, password)
	// The URLs' passwords are wrong: only the override can log in.
	plainURL := fmt.Sprintf("amqp://guest:url-pw@127.0.0.1:%d/", node.Port)
	tlsURL := fmt.Sprintf("amqps://guest:url-pw@127.0.0.1:%d/", node.TLSPort)
	good := rabbitbroker.Auth{Username: user, Password: config.Secret(password)}
	t.Run("override", func(t *testing.T) {
		publishes(t, node, plainURL, good)
	})
	t.Run("override over TLS", func(t *testing.T) {
		withTLS := good
		withTLS.TLS = config.TLS{Enabled: true, CAFile: node.Certs.CAFile}
		publishes(t, node, tlsURL, withTLS)
	})
	t.Run("wrong password", func(t *testing.T) {
		wrongPW := "wrong-" + randHex(8)
		_, err := newAuthSink(t, plainURL, rabbitbroker.Auth{Username: user, Password: config.Secret(wrongPW)})
		wantErr(t, err, []string{wrongPW, password, "url-pw"}, "rabbitmq sink auth", fmt.Sprintf("as user %q", user), "403",
			"check the username and password")
	})
}

// SASL EXTERNAL: the client certificate logs the sink in (whatever the URL's
// credentials); without a client certificate the broker refuses, and the
// error says to check it.
func TestSinkAuthExternal(t *testing.T) {
	t.Parallel()
	node := testenv.RabbitMQ(t)
	node.ExternalUser(t)
	url := fmt.Sprintf("amqps://guest:url-pw@127.0.0.1:%d/", node.TLSPort)
	ext := rabbitbroker.Auth{External: true, TLS: config.TLS{
		Enabled: true, CAFile: node.Certs.CAFile, CertFile: node.Certs.ClientCert, KeyFile: node.Certs.ClientKey,
	}}
	t.Run("client certificate", func(t *testing.T) {
		publishes(t, node, url, ext)
	})
	t.Run("no client certificate", func(t *testing.T) {
		noCert := ext
		noCert.TLS.CertFile, noCert.TLS.KeyFile = "", ""
		_, err := newAuthSink(t, url, noCert)
		wantErr(t, err, nil, "rabbitmq sink auth", "with SASL EXTERNAL", "403", "tls.cert_file")
	})
}

// When the broker goes away and refuses connections, Ready and Publish say
// so and why; the sink recovers when the broker is back. A proxy in front of
// the TLS listener plays the broker going away.
func TestSinkAuthReadyRefused(t *testing.T) {
	t.Parallel()
	node := testenv.RabbitMQ(t)
	node.ExternalUser(t)
	p := testenv.NewProxy(t, fmt.Sprintf("127.0.0.1:%d", node.TLSPort))
	url := fmt.Sprintf("amqps://%s/", p.Addr)
	auth := rabbitbroker.Auth{External: true, TLS: config.TLS{
		Enabled: true, CAFile: node.Certs.CAFile, CertFile: node.Certs.ClientCert, KeyFile: node.Certs.ClientKey,
	}}
	s, err := newAuthSink(t, url, auth)
	if err != nil {
		t.Fatal(err)
	}
	if err := s.Ready(); err != nil {
		t.Fatalf("Ready: %v", err)
	}

	p.Down(t)
	var why error
	testenv.Eventually(t, 30*time.Second, func() bool {
		why = s.Ready()
		return why != nil && strings.Contains(why.Error(), "connection refused")
	}, "Ready reports the refused connection")
	wantErr(t, why, nil, "rabbitmq sink auth", "reconnecting", "with SASL EXTERNAL", "connection refused",
		"nothing accepts connections at "+p.Addr, "that the broker is running")
	t.Logf("Ready while refused: %v", why)
	errs := publish(t, s, []sinks.Outgoing{msg("while-down", "q")})
	wantErr(t, errs[0], nil, "not connected", "connection refused")

	p.Up(t)
	testenv.Eventually(t, 30*time.Second, func() bool { return s.Ready() == nil }, "Ready after the broker is back")
}
