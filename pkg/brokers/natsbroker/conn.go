package natsbroker

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"net/url"
	"os"
	"strings"
	"time"

	"github.com/nats-io/nats.go"

	"github.com/delaybridge/delaybridge/pkg/sinks"
	"github.com/delaybridge/delaybridge/pkg/tlsutil"
)

// Connect dials url (a comma-separated server list) and keeps reconnecting
// forever with back-off; the connection state is logged. opts carry the
// authentication and TLS (AuthOptions).
func Connect(url, name string, log *slog.Logger, opts ...nats.Option) (*nats.Conn, error) {
	nc, err := nats.Connect(url, append([]nats.Option{
		nats.Name(name),
		nats.MaxReconnects(-1),
		nats.ReconnectWait(250 * time.Millisecond),
		nats.ReconnectJitter(100*time.Millisecond, time.Second),
		nats.RetryOnFailedConnect(false),
		// A server that keeps the connection and answers nothing (stopped,
		// or cut off by the network) is found by its PINGs going
		// unanswered; with nats.go's default, every 2 minutes with 2
		// outstanding, that takes minutes.
		nats.PingInterval(pingInterval),
		nats.MaxPingsOutstanding(maxPingsOut),
		nats.DisconnectErrHandler(func(_ *nats.Conn, err error) {
			if err != nil { // nil: closed on purpose
				log.Warn("nats disconnected; reconnecting", "err", err)
			}
		}),
		nats.ReconnectHandler(func(nc *nats.Conn) {
			log.Info("nats reconnected", "server", nc.ConnectedUrlRedacted())
		}),
		nats.ErrorHandler(func(_ *nats.Conn, _ *nats.Subscription, err error) {
			log.Warn("nats error", "err", err)
		}),
	}, opts...)...)
	if err != nil {
		return nil, fmt.Errorf("connect to nats %s: %w (is the server running, the url right, and are the credentials and TLS settings the server's?)", redact(url), err)
	}
	return nc, nil
}

// A connection whose server has not answered maxPingsOut PINGs sent
// pingInterval apart is taken for lost, and dialled again: one that
// answers nothing is found within about (maxPingsOut+1) * pingInterval.
const (
	pingInterval = 5 * time.Second
	maxPingsOut  = 2
)

// Flush waits until the server has processed everything sent on nc so far,
// or ctx ends. nats.go's FlushWithContext refuses a context without a
// deadline; such a context is given one far away, so that only the caller's
// cancellation ends the wait.
func Flush(ctx context.Context, nc *nats.Conn) error {
	if _, ok := ctx.Deadline(); !ok {
		var cancel context.CancelFunc
		ctx, cancel = context.WithTimeout(ctx, 24*time.Hour)
		defer cancel()
	}
	return nc.FlushWithContext(ctx)
}

// Ready returns nil when nc is connected, else its state, the servers it
// tries while it reconnects, and its last error (an authorization
// violation, for example).
func Ready(nc *nats.Conn) error {
	s := nc.Status()
	if s == nats.CONNECTED {
		return nil
	}
	what := fmt.Sprintf("nats connection is %s", s)
	if s == nats.RECONNECTING {
		what = fmt.Sprintf("nats connection lost, reconnecting to %s (is the server running and reachable?)", redact(strings.Join(nc.Servers(), ",")))
	}
	if err := nc.LastError(); err != nil {
		return fmt.Errorf("%s: %w", what, err)
	}
	return errors.New(what)
}

// AuthOptions turns the configured authentication and TLS into nats.go
// options.
func AuthOptions(a Auth) ([]nats.Option, error) {
	var opts []nats.Option
	tlsCfg, err := tlsutil.Client(a.TLS)
	if err != nil {
		return nil, err
	}
	if tlsCfg != nil {
		opts = append(opts, nats.Secure(tlsCfg))
	}
	switch {
	case a.User != "":
		opts = append(opts, nats.UserInfo(a.User, a.Password.Reveal()))
	case a.Token != "":
		opts = append(opts, nats.Token(a.Token.Reveal()))
	case a.NKeySeedFile != "":
		o, err := nats.NkeyOptionFromSeed(a.NKeySeedFile)
		if err != nil {
			return nil, fmt.Errorf("nkey_seed_file: %w", err)
		}
		opts = append(opts, o)
	case a.CredsFile != "":
		if _, err := os.Stat(a.CredsFile); err != nil {
			return nil, fmt.Errorf("creds_file: %w", err)
		}
		opts = append(opts, nats.UserCredentials(a.CredsFile))
	}
	return opts, nil
}

// redact hides passwords and tokens in a server list.
func redact(servers string) string {
	parts := strings.Split(servers, ",")
	for i, p := range parts {
		u, err := url.Parse(strings.TrimSpace(p))
		switch {
		case err != nil:
			parts[i] = "(unparsable url)" // it might hold a password
		case u.User != nil:
			u.User = url.User("***")
			parts[i] = u.String()
		}
	}
	return strings.Join(parts, ",")
}

// Unreachable reports whether connecting failed because no server answered
// (nats.go's "no servers available", or sinks.Unreachable), as opposed to
// one that answered and refused (credentials, TLS).
func Unreachable(err error) bool {
	return errors.Is(err, nats.ErrNoServers) || sinks.Unreachable(err)
}
