package daemon

import (
	"context"
	"crypto/tls"
	"fmt"
	"net"
	"syscall"
	"testing"
)

// What a start waits out, and what it fails at once (TestStartWaitsForARedisPassingThrough
// runs the wait against a Redis).
func TestWaitsAtStart(t *testing.T) {
	for _, c := range []struct {
		name string
		err  error
		want bool
	}{
		{"refused", &net.OpError{Op: "dial", Net: "tcp", Err: syscall.ECONNREFUSED}, true},
		{"timed out", fmt.Errorf("redis: %w", context.DeadlineExceeded), true},
		{"reset", &net.OpError{Op: "read", Net: "tcp", Err: syscall.ECONNRESET}, true},
		// A Kubernetes pod's own name resolves once it is ready.
		{"no such host", &net.OpError{Op: "dial", Net: "tcp", Err: &net.DNSError{Err: "no such host", Name: "redis-0.redis", IsNotFound: true}}, true},
		{"a TLS alert", fmt.Errorf("redis: %w", &net.OpError{Op: "remote error", Err: tls.AlertError(42)}), false},
		{"a stop", context.Canceled, false},
	} {
		if got := waitsAtStart(c.err); got != c.want {
			t.Errorf("%s (%v): waits %v, want %v", c.name, c.err, got, c.want)
		}
	}
}
