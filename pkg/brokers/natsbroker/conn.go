package natsbroker

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"net/url"
	"os"
	"strings"
	"sync"
	"sync/atomic"
	"time"

	"github.com/nats-io/nats.go"

	"github.com/delaybridge/delaybridge/pkg/sinks"
	"github.com/delaybridge/delaybridge/pkg/tlsutil"
)

// Connect dials url (a comma-separated server list) and keeps reconnecting
// forever with back-off; the connection state is logged. opts carry the
// authentication and TLS (AuthOptions).
func Connect(url, name string, log *slog.Logger, opts ...nats.Option) (*nats.Conn, error) {
	st := &connState{servers: url}
	st.status.Store(unknownStatus)
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
			st.status.Store(int32(nats.RECONNECTING))
			if err != nil { // nil: closed on purpose
				st.err.Store(&err)
				log.Warn("nats disconnected; reconnecting", "err", err)
			}
		}),
		nats.ConnectHandler(func(nc *nats.Conn) { // a first connection made after Connect (RetryOnFailedConnect)
			st.status.Store(int32(nats.CONNECTED))
			st.err.Store(nil)
			st.maxPayload.Store(nc.MaxPayload())
		}),
		nats.ReconnectHandler(func(nc *nats.Conn) {
			st.status.Store(int32(nats.CONNECTED))
			st.err.Store(nil)
			st.maxPayload.Store(nc.MaxPayload()) // the server's, which may be another
			log.Info("nats reconnected", "server", nc.ConnectedUrlRedacted())
		}),
		nats.ClosedHandler(func(nc *nats.Conn) { states.Delete(nc) }),
		nats.ErrorHandler(func(_ *nats.Conn, _ *nats.Subscription, err error) {
			log.Warn("nats error", "err", err)
		}),
	}, opts...)...)
	if err != nil {
		return nil, fmt.Errorf("connect to nats %s: %w (is the server running, the url right, and are the credentials and TLS settings the server's?)", redact(url), err)
	}
	st.status.CompareAndSwap(unknownStatus, int32(nc.Status())) // unless a handler said it already
	st.maxPayload.CompareAndSwap(0, nc.MaxPayload())
	states.Store(nc, st)
	return nc, nil
}

// unknownStatus is a connState's status before Connect returned.
const unknownStatus = -1

// connState is a connection's state as its handlers last said it: nats.go
// holds the connection's lock while it dials a server again, and
// nc.Status waits for it (up to the connect timeout, 2 s), which /readyz
// must not.
type connState struct {
	status  atomic.Int32
	err     atomic.Pointer[error] // why it was lost, until it is back
	servers string                // the configured servers
	// maxPayload is the max_payload of the server last connected to: the
	// most a message's body and headers may be. 0 unknown.
	maxPayload atomic.Int64
}

// states are the connState of each connection Connect made.
var states sync.Map // *nats.Conn -> *connState

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

// MaxPayload is the max_payload of the server nc last connected to, read
// without nats.go's lock (which a dial holds); 0 for a connection Connect
// did not make.
func MaxPayload(nc *nats.Conn) int64 {
	if v, ok := states.Load(nc); ok {
		return v.(*connState).maxPayload.Load()
	}
	return 0
}

// Ready returns nil when nc is connected, else its state, the servers it
// tries while it reconnects, and its last error (an authorization
// violation, for example).
func Ready(nc *nats.Conn) error {
	v, ok := states.Load(nc)
	if !ok || v.(*connState).status.Load() == unknownStatus { // not made by Connect, closed, or not said yet
		return ready(nc.Status(), nc.LastError(), func() string { return strings.Join(nc.Servers(), ",") })
	}
	st := v.(*connState)
	var last error
	if err := st.err.Load(); err != nil {
		last = *err
	}
	return ready(nats.Status(st.status.Load()), last, func() string { return st.servers })
}

func ready(s nats.Status, last error, servers func() string) error {
	if s == nats.CONNECTED {
		return nil
	}
	what := fmt.Sprintf("nats connection is %s", s)
	if s == nats.RECONNECTING {
		what = fmt.Sprintf("nats connection lost, reconnecting to %s (is the server running and reachable?)", redact(servers()))
	}
	if last != nil {
		return fmt.Errorf("%s: %w", what, last)
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
