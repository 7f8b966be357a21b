package rabbitbroker_test

import (
	"context"
	"crypto/rand"
	"encoding/hex"
	"fmt"
	"strings"
	"testing"
	"time"

	"github.com/delaybridge/delaybridge/internal/testenv"
	"github.com/delaybridge/delaybridge/pkg/brokers/rabbitbroker"
	"github.com/delaybridge/delaybridge/pkg/config"
	"github.com/delaybridge/delaybridge/pkg/envelope"
	"github.com/delaybridge/delaybridge/pkg/ingest"
)

func randHex(n int) string {
	b := make([]byte, n)
	_, _ = rand.Read(b)
	return hex.EncodeToString(b)
}

func newAuthSource(t testing.TB, url string, auth rabbitbroker.Auth, queue string) (*rabbitbroker.Source, error) {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	s, err := rabbitbroker.NewSource(ctx, rabbitbroker.SourceParams{Name: "auth", URL: url, Queue: queue, Prefetch: 10, Auth: auth}, quiet)
	if err != nil {
		return nil, err
	}
	t.Cleanup(func() { _ = s.Close(context.Background()) })
	return s, nil
}

func send(url string, auth rabbitbroker.Auth, queue, id string) error {
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	h := envelope.Headers{{Key: "x-delay", Value: "1s"}, {Key: "x-message-id", Value: id}}
	return rabbitbroker.Send(ctx, rabbitbroker.SourceParams{URL: url, Auth: auth, Queue: queue}, ingest.Publication{Headers: h, Body: []byte("body of " + id)})
}

// roundTrip sends a message with Send (url, auth) and reads it from a Source
// connected with the same url and auth: both ways work.
func roundTrip(t *testing.T, url string, auth rabbitbroker.Auth) {
	t.Helper()
	q := unique(t)
	s, err := newAuthSource(t, url, auth, q)
	if err != nil {
		t.Fatalf("New: %v", err)
	}
	if err := s.Ready(); err != nil {
		t.Fatalf("Ready: %v", err)
	}
	id := "m-" + randHex(4)
	if err := send(url, auth, q, id); err != nil {
		t.Fatalf("Send: %v", err)
	}
	in, ack := read(t, s)
	if got, _ := in.Headers.Get(envelope.HeaderMessageID); got != id || string(in.Body) != "body of "+id {
		t.Fatalf("read %q %q, want %s", in.Headers, in.Body, id)
	}
	if err := ack(context.Background(), nil); err != nil {
		t.Fatal(err)
	}
	closeSource(t, s)
}

// wantErr checks that err says every want and contains no secret.
func wantErr(t *testing.T, err error, secrets []string, want ...string) {
	t.Helper()
	if err == nil {
		t.Fatal("no error")
	}
	for _, w := range want {
		if !strings.Contains(err.Error(), w) {
			t.Errorf("error %q\ndoes not say %q", err, w)
		}
	}
	for _, s := range secrets {
		if strings.Contains(err.Error(), s) {
			t.Errorf("error %q\ncontains the secret %q", err, s)
		}
	}
}

// The ingest and Send over amqps: the right CA works; a wrong CA fails at
// New and in Send, saying to check tls.ca_file.
func TestSourceAuthTLS(t *testing.T) {
	t.Parallel()
	node := testenv.RabbitMQ(t)
	ca := config.TLS{Enabled: true, CAFile: node.Certs.CAFile}
	t.Run("right CA", func(t *testing.T) {
		roundTrip(t, node.TLSURL, rabbitbroker.Auth{TLS: ca})
	})
	t.Run("right CA, server name", func(t *testing.T) {
		named := ca
		named.ServerName = "localhost"
		roundTrip(t, node.TLSURL, rabbitbroker.Auth{TLS: named})
	})
	t.Run("wrong CA", func(t *testing.T) {
		wrong := rabbitbroker.Auth{TLS: config.TLS{Enabled: true, CAFile: node.Certs.OtherCAFile}}
		_, err := newAuthSource(t, node.TLSURL, wrong, unique(t))
		wantErr(t, err, nil, "rabbitmq ingest auth", "certificate signed by unknown authority", "check tls.ca_file")
		err = send(node.TLSURL, wrong, unique(t), "x")
		wantErr(t, err, nil, "unknown authority", "check tls.ca_file")
	})
}

// Username and password override the URL's for the ingest and Send; a wrong
// password fails with an error without it that says what to check.
func TestSourceAuthCredentials(t *testing.T) {
	t.Parallel()
	node := testenv.RabbitMQ(t)
	user, password := "ingest-"+randHex(4), "pw-"+randHex(12)
	node.AddUser(t, user, password)
	// The URLs' passwords are wrong: only the override can log in.
	plainURL := fmt.Sprintf("amqp://guest:url-pw@127.0.0.1:%d/", node.Port)
	tlsURL := fmt.Sprintf("amqps://guest:url-pw@127.0.0.1:%d/", node.TLSPort)
	good := rabbitbroker.Auth{Username: user, Password: config.Secret(password)}

	t.Run("override", func(t *testing.T) {
		roundTrip(t, plainURL, good)
	})
	t.Run("override over TLS", func(t *testing.T) {
		withTLS := good
		withTLS.TLS = config.TLS{Enabled: true, CAFile: node.Certs.CAFile}
		roundTrip(t, tlsURL, withTLS)
	})
	wrongPW := "wrong-" + randHex(8)
	bad := rabbitbroker.Auth{Username: user, Password: config.Secret(wrongPW)}
	// The broker answers a failed login after 3 s: wait in parallel.
	t.Run("wrong password, New", func(t *testing.T) {
		t.Parallel()
		_, err := newAuthSource(t, plainURL, bad, unique(t))
		wantErr(t, err, []string{wrongPW, password, "url-pw"}, "rabbitmq ingest auth", fmt.Sprintf("as user %q", user), "403",
			"check the username and password")
	})
	t.Run("wrong password, Send", func(t *testing.T) {
		t.Parallel()
		err := send(plainURL, bad, unique(t), "x")
		wantErr(t, err, []string{wrongPW, password, "url-pw"}, fmt.Sprintf("as user %q", user), "403", "check the username and password")
	})
}

// SASL EXTERNAL: the client certificate logs the ingest and Send in
// (whatever the URL's credentials); without a client certificate the broker
// refuses, and the error says to check it.
func TestSourceAuthExternal(t *testing.T) {
	t.Parallel()
	node := testenv.RabbitMQ(t)
	node.ExternalUser(t)
	url := fmt.Sprintf("amqps://guest:url-pw@127.0.0.1:%d/", node.TLSPort)
	ext := rabbitbroker.Auth{External: true, TLS: config.TLS{
		Enabled: true, CAFile: node.Certs.CAFile, CertFile: node.Certs.ClientCert, KeyFile: node.Certs.ClientKey,
	}}
	t.Run("client certificate", func(t *testing.T) {
		roundTrip(t, url, ext)
	})
	noCert := ext
	noCert.TLS.CertFile, noCert.TLS.KeyFile = "", ""
	t.Run("no client certificate, New", func(t *testing.T) {
		t.Parallel()
		_, err := newAuthSource(t, url, noCert, unique(t))
		wantErr(t, err, nil, "rabbitmq ingest auth", "with SASL EXTERNAL", "403", "tls.cert_file")
	})
	t.Run("no client certificate, Send", func(t *testing.T) {
		t.Parallel()
		err := send(url, noCert, unique(t), "x")
		wantErr(t, err, nil, "with SASL EXTERNAL", "403", "tls.cert_file")
	})
}

// When the broker goes away and refuses connections, Ready says so and why;
// it recovers when the broker is back. A proxy in front of the TLS listener
// plays the broker going away.
func TestSourceAuthReadyRefused(t *testing.T) {
	t.Parallel()
	node := testenv.RabbitMQ(t)
	user, password := "ready-"+randHex(4), "pw-"+randHex(12)
	node.AddUser(t, user, password)
	p := testenv.NewProxy(t, fmt.Sprintf("127.0.0.1:%d", node.TLSPort))
	url := fmt.Sprintf("amqps://%s/", p.Addr)
	auth := rabbitbroker.Auth{Username: user, Password: config.Secret(password),
		TLS: config.TLS{Enabled: true, CAFile: node.Certs.CAFile}}
	s, err := newAuthSource(t, url, auth, unique(t))
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
	wantErr(t, why, []string{password}, "rabbitmq ingest auth", "reconnecting", "connection refused",
		"nothing accepts connections at "+p.Addr, "that the broker is running")
	t.Logf("Ready while refused: %v", why)

	p.Up(t)
	testenv.Eventually(t, 30*time.Second, func() bool { return s.Ready() == nil }, "Ready after the broker is back")
}
