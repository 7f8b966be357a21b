package rabbitbroker

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
	"sync"
	"syscall"
	"time"

	amqp "github.com/rabbitmq/amqp091-go"

	"github.com/delaybridge/delaybridge/pkg/sinks"
	"github.com/delaybridge/delaybridge/pkg/tlsutil"
)

// DialTimeout bounds the TCP connect plus the AMQP handshake.
const DialTimeout = 10 * time.Second

// Heartbeat is the AMQP heartbeat interval asked for: a broker that vanishes
// without closing the TCP connection is noticed within about twice this.
const Heartbeat = 10 * time.Second

// Dial opens an AMQP connection to rawURL (amqp:// or amqps://) with the
// TLS and authentication of a (see DialConfig), named name in the broker's
// management UI. ctx cancels the TCP connect. The error names the broker
// (password hidden) and the identity, and says what to check; it never
// contains the password.
func Dial(ctx context.Context, rawURL, name string, a Auth) (*amqp.Connection, error) {
	u, cfg, err := DialConfig(rawURL, a)
	if err != nil {
		return nil, fmt.Errorf("connect to rabbitmq %s: %w", display(rawURL, a), err)
	}
	props := amqp.NewConnectionProperties()
	props.SetClientConnectionName(name)
	cfg.Heartbeat = Heartbeat
	cfg.Properties = props
	stopWatch := func() bool { return true }
	cfg.Dial = func(network, addr string) (net.Conn, error) {
		d := net.Dialer{Timeout: DialTimeout}
		c, err := d.DialContext(ctx, network, addr)
		if err != nil {
			return nil, err
		}
		// Bounds the TLS and AMQP handshakes; cleared by the library once
		// they are done. ctx ending ends them too (a stop while a broker
		// that took the connection says nothing).
		if err := c.SetDeadline(time.Now().Add(DialTimeout)); err != nil {
			c.Close()
			return nil, err
		}
		stopWatch = context.AfterFunc(ctx, func() { _ = c.SetDeadline(time.Now()) })
		return c, nil
	}
	conn, err := amqp.DialConfig(u, cfg)
	if !stopWatch() { // ctx ended during the handshake, which its deadline ended (or breaks)
		if err == nil {
			_ = conn.CloseDeadline(time.Now().Add(time.Second)) // the broker may not answer the close either
		}
		return nil, fmt.Errorf("connect to rabbitmq %s: %w", display(rawURL, a), ctx.Err())
	}
	if err != nil {
		return nil, explain(fmt.Errorf("connect to rabbitmq %s: %w", display(rawURL, a), err), rawURL, a)
	}
	return conn, nil
}

// DialConfig returns the URL to dial and the amqp.Config that carry the TLS
// and authentication of a, for amqp.DialConfig (the caller adds its
// heartbeat, properties and dialer):
//
//   - a.TLS (tls.enabled) needs an amqps:// URL; its CA file replaces the
//     system roots, its certificate and key are the client certificate, and
//     the server name defaults to the URL's host. An amqps:// URL without it
//     verifies the broker with the system roots.
//   - a.External authenticates with SASL EXTERNAL: the broker maps the TLS
//     client certificate to a user, and the URL's user and password are not
//     used.
//   - a.Username and a.Password override the URL's user and password (SASL
//     PLAIN); without them the URL's are used (guest:guest when it has none).
//
// Errors never contain the password.
func DialConfig(rawURL string, a Auth) (string, amqp.Config, error) {
	var cfg amqp.Config
	uri, err := amqp.ParseURI(rawURL)
	if err != nil {
		var ue *url.Error
		if errors.As(err, &ue) { // its text quotes the URL, and its inner error may quote a piece of the password
			return "", cfg, errors.New("bad url: not a URL (a reserved character in the user or password, such as / # ? @ %, must be percent-encoded)")
		}
		return "", cfg, fmt.Errorf("bad url: %w", err)
	}
	if a.TLS.Enabled {
		if uri.Scheme != "amqps" {
			return "", cfg, errors.New("tls is enabled but the url is amqp://: use amqps:// (the broker's TLS port, 5671 by default)")
		}
		tc, err := tlsutil.Client(a.TLS)
		if err != nil {
			return "", cfg, err
		}
		if tc.ServerName == "" {
			tc.ServerName = uri.Host
		}
		cfg.TLSClientConfig = tc
	}
	switch {
	case a.External:
		if uri.Scheme != "amqps" {
			return "", cfg, errors.New("external (SASL EXTERNAL) authenticates with the TLS client certificate: use an amqps:// url with tls.enabled, tls.cert_file and tls.key_file")
		}
		cfg.SASL = []amqp.Authentication{&amqp.ExternalAuth{}}
	case a.Username != "":
		cfg.SASL = []amqp.Authentication{&amqp.PlainAuth{Username: a.Username, Password: a.Password.Reveal()}}
	}
	return rawURL, cfg, nil
}

// display is rawURL as errors show it: without the password, and with the
// identity actually used.
func display(rawURL string, a Auth) string {
	u, err := url.Parse(rawURL)
	if err != nil {
		return "(unparsable url)"
	}
	switch {
	case a.External:
		u.User = nil
		return u.Redacted() + " with SASL EXTERNAL (the TLS client certificate)"
	case a.Username != "":
		u.User = nil
		return fmt.Sprintf("%s as user %q", u.Redacted(), a.Username)
	}
	return u.Redacted()
}

// Unreachable reports whether connecting failed because no broker answered
// (sinks.Unreachable), or one took the connection and never answered the
// handshake (silent), as opposed to one that answered and refused.
func Unreachable(err error) bool { return sinks.Unreachable(err) || silent(err) }

// Lost reports whether a connection was made and then lost without an
// answer from the broker: amqp091-go reports a read's failure as a frame
// error of its own, in words (EOF, a reset, a broken pipe). A frame that
// could not be parsed or a TLS alert is an answer, and not one of them.
func Lost(err error) bool {
	var e *amqp.Error
	if !errors.As(err, &e) || e.Server || e.Code != amqp.FrameError {
		return false
	}
	for _, w := range []string{"EOF", "connection reset", "broken pipe"} {
		if strings.Contains(e.Reason, w) && !strings.Contains(e.Reason, "tls:") {
			return true
		}
	}
	return false
}

// silent reports whether a connect failed because the broker took the
// connection and never answered the handshake: amqp091-go reports the
// read's timeout as a frame error, in words.
func silent(err error) bool {
	var e *amqp.Error
	return errors.As(err, &e) && e.Code == amqp.FrameError && strings.Contains(e.Reason, "i/o timeout")
}

// explain adds to err, a failed dial, what to check.
func explain(err error, rawURL string, a Auth) error {
	var (
		opErr      *net.OpError
		unknownCA  x509.UnknownAuthorityError
		hostErr    x509.HostnameError
		invalidErr x509.CertificateInvalidError
		recordErr  tls.RecordHeaderError
		amqpErr    *amqp.Error
	)
	where, secure := "the url's host and port", a.TLS.Enabled
	if u, perr := url.Parse(rawURL); perr == nil {
		where, secure = u.Host, secure || u.Scheme == "amqps"
	}
	var hint string
	switch {
	case errors.Is(err, syscall.ECONNREFUSED):
		hint = fmt.Sprintf("nothing accepts connections at %s: check the url's host and port and that the broker is running", where)
	case errors.As(err, &unknownCA):
		hint = "the broker's certificate is not signed by a CA trusted here: check tls.ca_file (the CA that signed the broker's certificate)"
	case errors.As(err, &hostErr):
		hint = fmt.Sprintf("the broker's certificate is not valid for %q: check the url's host or tls.server_name", hostErr.Host)
	case errors.As(err, &invalidErr):
		hint = "the broker's certificate is not valid (expired, or not for a server): check the broker's TLS certificate"
	case errors.As(err, &recordErr):
		hint = fmt.Sprintf("%s does not speak TLS: use the broker's TLS port, or amqp:// without tls", where)
	case errors.As(err, &opErr) && opErr.Op == "remote error",
		// With TLS 1.3 the broker's verdict on the client certificate
		// comes after the handshake, and amqp091-go reports it as a frame
		// error with the TLS alert as reason.
		errors.As(err, &amqpErr) && strings.Contains(amqpErr.Reason, "remote error: tls"):
		hint = "the broker refused the TLS connection: check tls.cert_file and tls.key_file (a client certificate signed by a CA the broker trusts; the broker may require one) and the broker's TLS settings"
	case errors.Is(err, amqp.ErrSASL) && a.External:
		hint = "the broker does not offer SASL EXTERNAL on this connection: it needs a TLS client certificate (tls.cert_file, tls.key_file) and the rabbitmq_auth_mechanism_ssl plugin with EXTERNAL in auth_mechanisms"
	case errors.Is(err, amqp.ErrSASL):
		hint = "the broker offers no authentication mechanism this client has (PLAIN, or EXTERNAL with external: true)"
	case errors.As(err, &amqpErr) && strings.Contains(strings.ToLower(amqpErr.Reason), "vhost"):
		hint = "check the vhost (the url's path) and the user's permissions on it"
	case errors.As(err, &amqpErr) && amqpErr.Code == amqp.AccessRefused && a.External:
		hint = "the broker refused the login with the client certificate: check that one is configured (tls.cert_file, tls.key_file) and that a RabbitMQ user named after its identity exists (the broker's ssl_cert_login_from: by default the certificate's distinguished name, or its common_name)"
	case errors.As(err, &amqpErr) && amqpErr.Code == amqp.AccessRefused:
		hint = "check the username and password (username with password or password_file, or the url's) and that the user exists"
	case errors.As(err, &amqpErr) && amqpErr.Code == amqp.FrameError:
		hint = fmt.Sprintf("%s does not answer in AMQP 0-9-1: check the url's port and whether it expects TLS (amqps:// with tls)", where)
	case errors.Is(err, os.ErrDeadlineExceeded) || errors.Is(err, context.DeadlineExceeded):
		hint = fmt.Sprintf("no answer from %s in time: check the url's host and port, firewalls, and whether the port expects TLS (amqps://)", where)
	case (errors.Is(err, io.EOF) || errors.Is(err, syscall.ECONNRESET) || errors.Is(err, syscall.EPIPE) ||
		errors.Is(err, amqp.ErrClosed) || errors.Is(err, net.ErrClosed)) && secure:
		// With TLS 1.3 a broker that rejects the client certificate may
		// close the connection before its alert is read; or amqp091-go's
		// reader reads the alert and closes the connection while the
		// protocol header is being written, and the write's "use of
		// closed network connection" is what Dial returns.
		hint = fmt.Sprintf("%s closed the connection during the handshake: check tls.cert_file and tls.key_file (a client certificate signed by a CA the broker trusts; the broker may require one), and that the port is the broker's TLS port", where)
	case errors.Is(err, io.EOF) || errors.Is(err, syscall.ECONNRESET) || errors.Is(err, syscall.EPIPE) || errors.Is(err, amqp.ErrClosed):
		hint = fmt.Sprintf("%s closed the connection during the handshake: check that it is an AMQP port and whether it expects TLS (amqps:// with tls)", where)
	default:
		return err
	}
	return fmt.Errorf("%w; %s", err, hint)
}

// Code returns the AMQP reply code of err (404 NOT_FOUND, 403
// ACCESS_REFUSED, 320 CONNECTION_FORCED ...), or 0 when err carries none.
func Code(err error) int {
	var ae *amqp.Error
	if errors.As(err, &ae) {
		return ae.Code
	}
	return 0
}

// State is a connection state for Ready: nil while connected, else why not.
type State struct {
	mu  sync.Mutex
	err error
}

// NewState returns a State that is not connected yet.
func NewState() *State {
	return &State{err: errors.New("not connected yet")}
}

// Up marks the connection as working.
func (s *State) Up() {
	s.mu.Lock()
	s.err = nil
	s.mu.Unlock()
}

// Down marks the connection as down because of err.
func (s *State) Down(err error) {
	if err == nil {
		err = errors.New("disconnected")
	}
	s.mu.Lock()
	s.err = err
	s.mu.Unlock()
}

// Err returns nil when connected, else the reason.
func (s *State) Err() error {
	s.mu.Lock()
	defer s.mu.Unlock()
	return s.err
}

// CloseReason describes why a connection or channel ended, from the value
// read from its NotifyClose channel (nil when the channel was closed without
// an error, which amqp091-go does on a graceful close).
func CloseReason(e *amqp.Error, what string) error {
	if e == nil {
		return fmt.Errorf("%s closed", what)
	}
	return fmt.Errorf("%s closed: %w", what, e)
}
