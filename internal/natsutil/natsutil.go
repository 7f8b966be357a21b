// Package natsutil holds what the NATS ingest and sink share: how to connect
// and how to tell whether the connection is up.
package natsutil

import (
	"context"
	"fmt"
	"log/slog"
	"net/url"
	"strings"
	"time"

	"github.com/nats-io/nats.go"
)

// Connect dials url (a comma-separated server list) and keeps reconnecting
// forever with back-off; the connection state is logged.
func Connect(url, name string, log *slog.Logger) (*nats.Conn, error) {
	nc, err := nats.Connect(url,
		nats.Name(name),
		nats.MaxReconnects(-1),
		nats.ReconnectWait(250*time.Millisecond),
		nats.ReconnectJitter(100*time.Millisecond, time.Second),
		nats.RetryOnFailedConnect(false),
		nats.DisconnectErrHandler(func(_ *nats.Conn, err error) {
			if err != nil { // nil: closed on purpose
				log.Warn("nats disconnected; reconnecting", "err", err)
			}
		}),
		nats.ReconnectHandler(func(nc *nats.Conn) {
			log.Info("nats reconnected", "server", nc.ConnectedUrlRedacted())
		}),
	)
	if err != nil {
		return nil, fmt.Errorf("connect to nats %s: %w (is the server running and the url right?)", redact(url), err)
	}
	return nc, nil
}

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

// Ready returns nil when nc is connected.
func Ready(nc *nats.Conn) error {
	if s := nc.Status(); s != nats.CONNECTED {
		return fmt.Errorf("nats connection is %s", s)
	}
	return nil
}

// redact hides passwords and tokens in a server list.
func redact(servers string) string {
	parts := strings.Split(servers, ",")
	for i, p := range parts {
		if u, err := url.Parse(strings.TrimSpace(p)); err == nil && u.User != nil {
			u.User = url.User("***")
			parts[i] = u.String()
		}
	}
	return strings.Join(parts, ",")
}
