package testenv

import (
	"errors"
	"fmt"
	"io"
	"net"
	"sync"
	"testing"
)

// Proxy forwards TCP connections from Addr to a target, so that a test can
// cut a client off a server: Down closes the listener and every connection
// (connecting is then refused), Up listens again on the same address.
type Proxy struct {
	Addr   string
	target string

	mu    sync.Mutex
	ln    net.Listener
	conns map[net.Conn]bool
	wg    sync.WaitGroup
	// flowing is closed while what the target answers is passed on; Stall
	// makes a new one, Flow closes it. sending is the same for what the
	// clients send, made by Hold.
	flowing, sending chan struct{}
}

func NewProxy(t testing.TB, target string) *Proxy {
	p := &Proxy{Addr: fmt.Sprintf("127.0.0.1:%d", FreePort(t)), target: target, conns: map[net.Conn]bool{}, flowing: make(chan struct{}), sending: make(chan struct{})}
	close(p.flowing)
	close(p.sending)
	p.Up(t)
	t.Cleanup(func() { p.Down(t) })
	return p
}

// Up listens (again) on Addr.
func (p *Proxy) Up(t testing.TB) {
	t.Helper()
	ln, err := net.Listen("tcp", p.Addr)
	if err != nil {
		t.Fatal(err)
	}
	p.mu.Lock()
	p.ln = ln
	p.mu.Unlock()
	p.wg.Add(1)
	go func() {
		defer p.wg.Done()
		for {
			c, err := ln.Accept()
			if err != nil {
				return
			}
			p.wg.Add(1)
			go func() {
				defer p.wg.Done()
				p.pipe(c)
			}()
		}
	}()
}

func (p *Proxy) track(c net.Conn) bool {
	p.mu.Lock()
	defer p.mu.Unlock()
	if p.ln == nil {
		return false
	}
	p.conns[c] = true
	return true
}

func (p *Proxy) pipe(c net.Conn) {
	u, err := net.Dial("tcp", p.target)
	if err != nil {
		c.Close()
		return
	}
	if !p.track(c) || !p.track(u) {
		c.Close()
		u.Close()
		return
	}
	done := make(chan struct{}, 2)
	go func() { _, _ = io.Copy(u, held{c, p, &p.sending}); done <- struct{}{} }()
	go func() { _, _ = io.Copy(c, held{u, p, &p.flowing}); done <- struct{}{} }()
	<-done
	c.Close()
	u.Close()
	<-done
}

// held reads one direction of a connection, holding what it read while
// the channel *gate points to is open (made by Stall or Hold).
type held struct {
	c    net.Conn
	p    *Proxy
	gate *chan struct{}
}

func (h held) Read(b []byte) (int, error) {
	n, err := h.c.Read(b)
	h.p.mu.Lock()
	gate := *h.gate
	h.p.mu.Unlock()
	<-gate
	return n, err
}

// Stall holds what the target answers from now on, on every connection,
// while what the clients send still reaches it: a server that takes a
// request and whose answer does not come (a publish stored, its
// confirmation late).
func (p *Proxy) Stall() { p.shut(&p.flowing) }

// Hold holds what the clients send from now on, on every connection, while
// what the target answers still comes: a request that reaches the server
// late.
func (p *Proxy) Hold() { p.shut(&p.sending) }

// shut holds what passes the gate *gate points to (Stall, Hold): a closed
// channel lets it pass, so it puts a new one in its place, which Flow
// closes; a gate shut already stays so.
func (p *Proxy) shut(gate *chan struct{}) {
	p.mu.Lock()
	defer p.mu.Unlock()
	select {
	case <-*gate:
		*gate = make(chan struct{})
	default:
	}
}

// Flow passes on what was held during a Stall or a Hold, and what comes
// next.
func (p *Proxy) Flow() {
	p.mu.Lock()
	defer p.mu.Unlock()
	p.flow()
}

// flow is Flow with p.mu held.
func (p *Proxy) flow() {
	for _, gate := range []chan struct{}{p.flowing, p.sending} {
		select {
		case <-gate:
		default:
			close(gate)
		}
	}
}

// Cut closes every connection and keeps listening: the clients see their
// connections reset, and reconnecting succeeds at once.
func (p *Proxy) Cut() {
	p.mu.Lock()
	defer p.mu.Unlock()
	p.flow() // unblocks the copies, so that they end with their connections
	for c := range p.conns {
		c.Close()
	}
	clear(p.conns)
}

// Down closes the listener and every connection: connecting is refused.
func (p *Proxy) Down(t testing.TB) {
	t.Helper()
	p.mu.Lock()
	p.flow() // unblocks the copies, so that they end with their connections
	ln := p.ln
	p.ln = nil
	for c := range p.conns {
		c.Close()
	}
	clear(p.conns)
	p.mu.Unlock()
	if ln != nil {
		if err := ln.Close(); err != nil && !errors.Is(err, net.ErrClosed) {
			t.Error(err)
		}
	}
	p.wg.Wait()
}
