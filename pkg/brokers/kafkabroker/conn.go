package kafkabroker

import (
	"context"
	"crypto/tls"
	"crypto/x509"
	"errors"
	"fmt"
	"io"
	"os"
	"strings"
	"syscall"
	"time"

	"github.com/segmentio/kafka-go"
	"github.com/segmentio/kafka-go/sasl"
	"github.com/segmentio/kafka-go/sasl/plain"
	"github.com/segmentio/kafka-go/sasl/scram"

	"github.com/delaybridge/delaybridge/pkg/tlsutil"
)

// ClientAuth returns the TLS configuration and the SASL mechanism of a, each nil
// when off: give both to kafka.Dialer{TLS, SASLMechanism} and
// kafka.Transport{TLS, SASL}. The password is a.SASL.Password, or the
// contents of password_file when the configuration was not loaded with
// config.Load (which fills Password from it). No error contains the
// password.
func ClientAuth(a Auth) (*tls.Config, sasl.Mechanism, error) {
	tlsCfg, err := tlsutil.Client(a.TLS)
	if err != nil {
		return nil, nil, fmt.Errorf("kafka %w", err)
	}
	mech, err := Mechanism(a.SASL)
	if err != nil {
		return nil, nil, err
	}
	return tlsCfg, mech, nil
}

// Mechanism returns the SASL mechanism of s, nil when s.Mechanism is empty.
func Mechanism(s SASL) (sasl.Mechanism, error) {
	if s.Mechanism == "" {
		return nil, nil
	}
	pw := s.Password.Reveal()
	if pw == "" && s.PasswordFile != "" {
		data, err := os.ReadFile(s.PasswordFile)
		if err != nil {
			return nil, fmt.Errorf("kafka sasl.password_file: %w", err)
		}
		pw = strings.TrimRight(string(data), "\r\n")
	}
	if s.Username == "" || pw == "" {
		return nil, fmt.Errorf("kafka sasl %s: give username and password (or password_file)", s.Mechanism)
	}
	var m sasl.Mechanism
	switch strings.ToLower(s.Mechanism) {
	case "plain":
		m = plain.Mechanism{Username: s.Username, Password: pw}
	case "scram-sha-256", "scram-sha-512":
		algo := scram.SHA256
		if strings.ToLower(s.Mechanism) == "scram-sha-512" {
			algo = scram.SHA512
		}
		var err error
		if m, err = scram.Mechanism(algo, s.Username, pw); err != nil {
			// The error quotes the password: leave it out.
			return nil, fmt.Errorf("kafka sasl %s: the username or password has characters SCRAM does not allow (SASLprep)", s.Mechanism)
		}
	default:
		return nil, fmt.Errorf("kafka sasl.mechanism %q is not one of plain, scram-sha-256, scram-sha-512", s.Mechanism)
	}
	return redacted{m, s.Username}, nil
}

// redacted is a mechanism that prints without its password, so that a
// Config holding it can be logged or formatted with %+v.
type redacted struct {
	sasl.Mechanism
	user string
}

func (r redacted) String() string   { return fmt.Sprintf("SASL %s user %q", r.Name(), r.user) }
func (r redacted) GoString() string { return r.String() }

// hinted is an error with advice on what to check.
type hinted struct {
	err  error
	hint string
}

func (h *hinted) Error() string { return h.err.Error() + " (" + h.hint + ")" }
func (h *hinted) Unwrap() error { return h.err }

// Explain returns err with what to check added when it is an
// authentication or TLS failure, or a connection the broker closed at once
// (which is how a broker answers a client that speaks plaintext to a TLS
// listener, or skips SASL). Other errors, and nil, come back unchanged, as
// does an error already explained. errors.Is and errors.As still see err.
func Explain(err error) error {
	if err == nil {
		return nil
	}
	var h *hinted
	if errors.As(err, &h) {
		return err
	}
	if hint := Hint(err); hint != "" {
		return &hinted{err, hint}
	}
	return err
}

// Hint says what to check for err, or "" when err is not about
// authentication or TLS.
func Hint(err error) string {
	var (
		unknownCA   x509.UnknownAuthorityError
		hostname    x509.HostnameError
		invalid     x509.CertificateInvalidError
		verify      *tls.CertificateVerificationError
		record      tls.RecordHeaderError
		ke          kafka.Error
		alertPrefix = "remote error: tls: "
	)
	msg := err.Error()
	switch {
	case errors.Is(err, kafka.SASLAuthenticationFailed):
		return "the broker refused the SASL credentials: check sasl.mechanism, sasl.username and sasl.password (or password_file)"
	case errors.As(err, &ke) && (ke == kafka.UnsupportedSASLMechanism || ke == kafka.IllegalSASLState):
		return "the broker does not accept this SASL mechanism: check sasl.mechanism against the broker's sasl.enabled.mechanisms"
	case errors.As(err, &unknownCA):
		return "the broker's certificate is not signed by a CA in tls.ca_file (or the system roots without it): check tls.ca_file"
	case errors.As(err, &hostname):
		return "the broker's certificate is not for this host name: check tls.server_name and the broker addresses"
	case errors.As(err, &invalid):
		return "the broker's certificate is not valid (expired or not for a server): check the broker's certificate and tls.ca_file"
	case errors.As(err, &verify):
		return "the broker's certificate could not be verified: check tls.ca_file and tls.server_name"
	case errors.As(err, &record):
		return "the broker does not speak TLS on this port: check tls.enabled and the broker addresses"
	case strings.Contains(msg, alertPrefix+"certificate required"), strings.Contains(msg, alertPrefix+"bad certificate"),
		strings.Contains(msg, alertPrefix+"unknown certificate authority"), strings.Contains(msg, alertPrefix+"certificate unknown"):
		return "the broker refused the client certificate: check tls.cert_file and tls.key_file"
	case strings.Contains(msg, alertPrefix):
		return "the broker refused the TLS handshake: check the tls settings against the broker's listener"
	case closed(err):
		return closedHint
	}
	return ""
}

const closedHint = "the broker closed the connection: if this persists, check that tls and sasl match the broker's listener"

func closed(err error) bool {
	return errors.Is(err, io.EOF) || errors.Is(err, io.ErrUnexpectedEOF) || errors.Is(err, syscall.ECONNRESET)
}

// Diagnose is Explain, and more when err is only a closed connection: that
// is how a broker refuses SASL credentials or a missing client certificate
// to kafka-go's Transport (the Writer's and Client's), which then reports
// nothing more than EOF. probe (Probe, or a cached result of it) tries a
// fresh connection that does report the reason; when it names something
// to check, that is added to err.
func Diagnose(err error, probe func() error) error {
	if err == nil || Hint(err) != closedHint || probe == nil {
		return Explain(err)
	}
	perr := probe()
	if perr == nil {
		return Explain(err)
	}
	hint := Hint(perr)
	if hint == "" || hint == closedHint {
		return Explain(err)
	}
	msg := perr.Error()
	var h *hinted
	if errors.As(perr, &h) {
		msg = strings.Replace(msg, " ("+h.hint+")", "", 1)
	}
	return &hinted{err, hint + "; a new connection got: " + msg}
}

// Probe connects to the brokers in turn with d (so with its TLS and SASL)
// and asks each for the list of brokers, which a broker answers only once
// the client is authenticated; it returns nil as soon as one answers, else
// the last failure, explained. Each attempt is bounded by d.Timeout (10s
// when 0) and ctx.
func Probe(ctx context.Context, d *kafka.Dialer, brokers []string) error {
	timeout := d.Timeout
	if timeout <= 0 {
		timeout = 10 * time.Second
	}
	err := errors.New("no brokers")
	for _, b := range brokers {
		if err = probe(ctx, d, b, timeout); err == nil {
			return nil
		}
	}
	return Explain(err)
}

func probe(ctx context.Context, d *kafka.Dialer, broker string, timeout time.Duration) error {
	ctx, cancel := context.WithTimeout(ctx, timeout)
	defer cancel()
	conn, err := d.DialContext(ctx, "tcp", broker)
	if err != nil {
		return err
	}
	defer conn.Close()
	deadline, _ := ctx.Deadline()
	if err := conn.SetDeadline(deadline); err != nil {
		return err
	}
	if _, err := conn.Brokers(); err != nil {
		return fmt.Errorf("%s: %w", broker, err)
	}
	return nil
}
