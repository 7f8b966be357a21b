package kafkabroker

import (
	"crypto/tls"
	"crypto/x509"
	"errors"
	"fmt"
	"io"
	"os"
	"path/filepath"
	"strings"
	"testing"

	"github.com/segmentio/kafka-go"

	"github.com/delaybridge/delaybridge/internal/testenv"
	"github.com/delaybridge/delaybridge/pkg/config"
)

const pw = "unit-pw-93b1-secret"

func TestAuthOff(t *testing.T) {
	tlsCfg, mech, err := ClientAuth(Auth{})
	if tlsCfg != nil || mech != nil || err != nil {
		t.Fatalf("Auth of nothing = %v, %v, %v; want nil, nil, nil", tlsCfg, mech, err)
	}
}

func TestAuthMechanisms(t *testing.T) {
	certs := testenv.NewCerts(t, "delaybridge")
	pwFile := filepath.Join(t.TempDir(), "pw")
	if err := os.WriteFile(pwFile, []byte(pw+"\n"), 0o600); err != nil {
		t.Fatal(err)
	}
	for mechanism, name := range map[string]string{"plain": "PLAIN", "scram-sha-256": "SCRAM-SHA-256", "scram-sha-512": "SCRAM-SHA-512", "SCRAM-SHA-512": "SCRAM-SHA-512"} {
		for _, s := range []SASL{
			{Mechanism: mechanism, Username: "db", Password: pw},
			{Mechanism: mechanism, Username: "db", PasswordFile: pwFile},
		} {
			tlsCfg, mech, err := ClientAuth(Auth{TLS: config.TLS{Enabled: true, CAFile: certs.CAFile}, SASL: s})
			if err != nil {
				t.Fatalf("%s: %v", mechanism, err)
			}
			if tlsCfg == nil || tlsCfg.RootCAs == nil || tlsCfg.MinVersion != tls.VersionTLS12 {
				t.Errorf("%s: TLS config %+v", mechanism, tlsCfg)
			}
			if mech == nil || mech.Name() != name {
				t.Fatalf("%s: mechanism %v", mechanism, mech)
			}
			// The mechanism, and anything holding it, prints without the password.
			holder := struct{ SASL any }{mech}
			for _, f := range []string{"%v", "%+v", "%#v", "%s"} {
				if out := fmt.Sprintf(f, holder); strings.Contains(out, pw) || !strings.Contains(out, "db") {
					t.Errorf("%s: %s prints %q", mechanism, f, out)
				}
			}
			if s.PasswordFile != "" && name == "PLAIN" {
				_, first, err := mech.Start(t.Context())
				if err != nil || string(first) != "\x00db\x00"+pw {
					t.Errorf("PLAIN from password_file sends %q, %v (trailing newline not dropped?)", first, err)
				}
			}
		}
	}
}

func TestAuthErrors(t *testing.T) {
	for name, c := range map[string]struct {
		a    Auth
		want string
	}{
		"unknown mechanism": {Auth{SASL: SASL{Mechanism: "gssapi", Username: "db", Password: pw}}, "not one of plain"},
		"no username":       {Auth{SASL: SASL{Mechanism: "plain", Password: pw}}, "give username and password"},
		"no password":       {Auth{SASL: SASL{Mechanism: "plain", Username: "db"}}, "give username and password"},
		"password_file":     {Auth{SASL: SASL{Mechanism: "plain", Username: "db", PasswordFile: "/nonexistent/pw"}}, "password_file"},
		// xdg-go/scram quotes the password in this error: it must not get through.
		"SASLprep": {Auth{SASL: SASL{Mechanism: "scram-sha-256", Username: "db", Password: pw + "\u0007"}}, "SASLprep"},
		"ca_file":  {Auth{TLS: config.TLS{Enabled: true, CAFile: "/nonexistent/ca.pem"}}, "ca_file"},
	} {
		_, _, err := ClientAuth(c.a)
		if err == nil || !strings.Contains(err.Error(), c.want) {
			t.Errorf("%s: error %v, want one containing %q", name, err, c.want)
		}
		if err != nil && strings.Contains(err.Error(), pw) {
			t.Errorf("%s: the password is in the error: %v", name, err)
		}
	}
}

func TestExplain(t *testing.T) {
	if Explain(nil) != nil {
		t.Error("Explain(nil) != nil")
	}
	plain := errors.New("topic does not exist")
	if Explain(plain) != plain {
		t.Error("an unrelated error was changed")
	}
	for _, c := range []struct {
		err  error
		want string
	}{
		{fmt.Errorf("could not successfully authenticate to 127.0.0.1:9092 with SASL: %w", kafka.SASLAuthenticationFailed), "sasl.password"},
		{fmt.Errorf("SASL handshake failed: %w", kafka.UnsupportedSASLMechanism), "sasl.mechanism"},
		{&tls.CertificateVerificationError{Err: x509.UnknownAuthorityError{}}, "tls.ca_file"},
		{fmt.Errorf("dial: %w", x509.HostnameError{Certificate: &x509.Certificate{}, Host: "kafka"}), "tls.server_name"},
		{tls.RecordHeaderError{Msg: "first record does not look like a TLS handshake"}, "tls.enabled"},
		{errors.New("remote error: tls: certificate required"), "tls.cert_file"},
		{errors.New("remote error: tls: handshake failure"), "tls settings"},
		{fmt.Errorf("read: %w", io.EOF), "tls and sasl"},
	} {
		got := Explain(c.err)
		if !errors.Is(got, c.err) {
			t.Errorf("Explain(%v) does not wrap it", c.err)
		}
		if !strings.Contains(got.Error(), c.want) || !strings.HasPrefix(got.Error(), c.err.Error()) {
			t.Errorf("Explain(%v) = %q, want it followed by a hint about %q", c.err, got, c.want)
		}
		if again := Explain(fmt.Errorf("outer: %w", got)); strings.Count(again.Error(), "check") != 1 {
			t.Errorf("explained twice: %q", again)
		}
	}
}

func TestDiagnose(t *testing.T) {
	refused := func() error {
		return Explain(fmt.Errorf("could not successfully authenticate to b:9092 with SASL: %w", kafka.SASLAuthenticationFailed))
	}
	closedConn := fmt.Errorf("write: %w", io.ErrUnexpectedEOF)

	got := Diagnose(closedConn, refused)
	if !errors.Is(got, io.ErrUnexpectedEOF) || !strings.Contains(got.Error(), "check sasl.mechanism") ||
		!strings.Contains(got.Error(), "a new connection got: could not successfully authenticate") || strings.Count(got.Error(), "check") != 1 {
		t.Errorf("closed connection, probe refused: %v", got)
	}
	for name, probe := range map[string]func() error{
		"probe fine":   func() error { return nil },
		"probe closed": func() error { return Explain(io.EOF) },
		"no probe":     nil,
	} {
		if got := Diagnose(closedConn, probe); !strings.Contains(got.Error(), "the broker closed the connection") {
			t.Errorf("%s: %v", name, got)
		}
	}
	other := kafka.UnknownTopicOrPartition
	if got := Diagnose(other, func() error { t.Error("probed for an error that says what it is"); return nil }); got != other {
		t.Errorf("unrelated error changed: %v", got)
	}
	if Diagnose(nil, refused) != nil {
		t.Error("Diagnose(nil) != nil")
	}
}
