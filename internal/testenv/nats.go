package testenv

import (
	"fmt"
	"sync"
	"testing"
	"time"

	"github.com/nats-io/nats-server/v2/server"
	"github.com/nats-io/nats.go"
	"github.com/nats-io/nats.go/jetstream"
)

// NATSServer is an embedded nats-server with JetStream, running in the test process.
// A daemon under test in another process can connect to URL as long as the test runs.
type NATSServer struct {
	URL      string // nats://127.0.0.1:PORT
	Port     int
	StoreDir string // JetStream storage, kept across Restart

	mu     sync.Mutex
	Server *server.Server // the current server; replaced by Restart (read it after Restart)

	t testing.TB
}

// NATS starts an embedded nats-server with JetStream (StoreDir in t.TempDir()), NoLog,
// NoSigs, on a reserved free 127.0.0.1 port, waits for ReadyForConnections and shuts
// it down in t.Cleanup. Ready in ~30 ms.
//
// Caveat: the server runs in the test process, so -race also instruments it and
// (in a cold build cache) it takes ~40 s to compile.
func NATS(t testing.TB) *NATSServer {
	skipShort(t, "a NATS server")
	t.Helper()
	n := &NATSServer{StoreDir: t.TempDir(), t: t}
	t.Cleanup(n.Shutdown)
	// A port reserved in this process can still be taken by another test
	// process before the server listens: then it never gets ready, and
	// another port is tried.
	for try := 1; ; try++ {
		n.Port = reservePorts(t, portLo, portHi)
		n.URL = fmt.Sprintf("nats://127.0.0.1:%d", n.Port)
		if err := n.tryStart(); err == nil {
			return n
		} else if try == 3 {
			t.Fatalf("testenv: %v", err)
		}
	}
}

func (n *NATSServer) options() *server.Options {
	return &server.Options{
		ServerName: fmt.Sprintf("testenv-%d", n.Port),
		Host:       "127.0.0.1",
		Port:       n.Port,
		JetStream:  true,
		StoreDir:   n.StoreDir,
		NoLog:      true,
		NoSigs:     true,
	}
}

func (n *NATSServer) start() {
	n.t.Helper()
	if err := n.tryStart(); err != nil {
		n.t.Fatalf("testenv: %v", err)
	}
}

// tryStart starts the server on n.Port and waits until it is ready.
func (n *NATSServer) tryStart() error {
	s, err := server.NewServer(n.options())
	if err != nil {
		return fmt.Errorf("nats NewServer: %w", err)
	}
	go s.Start()
	if !s.ReadyForConnections(15 * time.Second) {
		s.Shutdown()
		return fmt.Errorf("nats-server on %s not ready after 15s", n.URL)
	}
	if !s.JetStreamEnabled() {
		s.Shutdown()
		return fmt.Errorf("nats-server on %s started without JetStream", n.URL)
	}
	n.mu.Lock()
	n.Server = s
	n.mu.Unlock()
	return nil
}

// Shutdown stops the server and waits until it is down; connected clients see a
// disconnect (nats.go then tries to reconnect). No-op if already down.
func (n *NATSServer) Shutdown() {
	n.mu.Lock()
	s := n.Server
	n.Server = nil
	n.mu.Unlock()
	if s != nil {
		s.Shutdown()
		s.WaitForShutdown()
	}
}

// Restart shuts the server down if it is running and starts a new one on the same
// port and StoreDir (streams, consumers and stored messages survive), then waits
// until it is ready. n.Server refers to the new server afterwards.
func (n *NATSServer) Restart() {
	n.t.Helper()
	n.Shutdown()
	n.start()
}

// Client connects a test's own client to the server (ConnectNATS).
func (n *NATSServer) Client(t testing.TB, opts ...nats.Option) (*nats.Conn, jetstream.JetStream) {
	t.Helper()
	return ConnectNATS(t, n.URL, opts...)
}

// ConnectNATS connects a test's own client to url (opts added to nats.go's
// defaults), closed in t.Cleanup, with its JetStream context.
func ConnectNATS(t testing.TB, url string, opts ...nats.Option) (*nats.Conn, jetstream.JetStream) {
	t.Helper()
	nc, err := nats.Connect(url, opts...)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(nc.Close)
	js, err := jetstream.New(nc)
	if err != nil {
		t.Fatal(err)
	}
	return nc, js
}
