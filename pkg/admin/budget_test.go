package admin

import (
	"bufio"
	"fmt"
	"io"
	"net"
	"net/http"
	"strings"
	"testing"
	"time"

	"github.com/delaybridge/delaybridge/internal/testenv"
)

// Large bodies decode in turns within the budget (two of the largest
// document at once), small ones beside them; a large body waiting for its
// turn decodes when one is done.
func TestDecodeBudgetTakesTurns(t *testing.T) {
	const large = 4 * maxSmallBody
	b := newDecodeBudget(large)
	in := make(chan int, 3)
	hold := []chan struct{}{make(chan struct{}), make(chan struct{})}
	for i := range hold {
		go func() {
			_ = b.decode(large, func() error { in <- i; <-hold[i]; return nil })
		}()
	}
	for range hold {
		select {
		case <-in:
		case <-time.After(10 * time.Second):
			t.Fatal("two of the largest bodies did not decode side by side")
		}
	}
	if b.sem.TryAcquire(1) {
		t.Fatal("the budget had room beside two of the largest bodies")
	}
	ran := false
	_ = b.decode(100, func() error { ran = true; return nil }) // a few short fields pass beside them
	if !ran {
		t.Fatal("a small body did not decode beside two of the largest")
	}
	third := make(chan struct{})
	go func() { _ = b.decode(maxSmallBody+1, func() error { close(third); return nil }) }()
	close(hold[0])
	select {
	case <-third:
	case <-time.After(10 * time.Second):
		t.Fatal("a body waiting for its turn did not decode when one was done")
	}
	close(hold[1])
}

// A refusal of a request that announced a body it has not sent (here
// without the token) comes at once and closes the connection: Go's server
// would first read the body, to reuse the connection, and held it for the
// read timeout, a minute, for a client that had not even authenticated.
func TestRefusalOfAnUnsentBodyComesAtOnce(t *testing.T) {
	e := newEnv(t, withToken("secret"))
	conn, err := net.Dial("tcp", strings.TrimPrefix(e.url, "http://"))
	if err != nil {
		t.Fatal(err)
	}
	defer conn.Close()
	if _, err := conn.Write([]byte("POST /v1/messages HTTP/1.1\r\nHost: " + strings.TrimPrefix(e.url, "http://") +
		"\r\nContent-Type: application/json\r\nContent-Length: 100000\r\n\r\n")); err != nil {
		t.Fatal(err)
	}
	if err := conn.SetReadDeadline(time.Now().Add(10 * time.Second)); err != nil {
		t.Fatal(err)
	}
	br := bufio.NewReader(conn)
	resp, err := http.ReadResponse(br, nil)
	if err != nil {
		t.Fatalf("no answer within 10 s to a request whose body never came: %v", err)
	}
	_, _ = io.Copy(io.Discard, resp.Body)
	resp.Body.Close()
	if resp.StatusCode != http.StatusUnauthorized || !resp.Close {
		t.Fatalf("answer %d, closing %v; want 401 and the connection closed", resp.StatusCode, resp.Close)
	}
	if _, err := br.ReadByte(); err != io.EOF {
		t.Fatalf("the connection after the refusal: %v, want it closed by the server (EOF)", err)
	}
}

// Large bodies in flight are bounded by size: four of the largest held at
// once (here sent no further than their headers) leave no room, and a
// fifth is answered 503 with Retry-After, its body unread, while short
// bodies pass beside them; when one goes, large bodies are taken again.
// Two hundred at once took the daemon to 4 GB.
func TestBodyBudgetBoundsTheBodiesHeld(t *testing.T) {
	e := newEnv(t)
	b := e.server.bodies
	b.wait = 200 * time.Millisecond
	largest := e.server.ops.Limits().MaxDocumentBytes()
	host := strings.TrimPrefix(e.url, "http://")
	holders := make([]net.Conn, 4)
	for i := range holders {
		conn, err := net.Dial("tcp", host)
		if err != nil {
			t.Fatal(err)
		}
		defer conn.Close()
		if _, err := fmt.Fprintf(conn, "POST /v1/messages HTTP/1.1\r\nHost: %s\r\nContent-Type: application/json\r\nContent-Length: %d\r\n\r\n{", host, largest); err != nil {
			t.Fatal(err)
		}
		holders[i] = conn
	}
	full := func() bool {
		if b.sem.TryAcquire(1) {
			b.sem.Release(1)
			return false
		}
		return true
	}
	testenv.Eventually(t, 10*time.Second, full, "four of the largest bodies held fill the budget")
	big := `{"sink":"rabbit","destination":"d","delay":"1h","body":"` + strings.Repeat("x", maxSmallBody) + `"}`
	r := e.do("POST", "/v1/messages", big)
	if r.status != http.StatusServiceUnavailable || r.header.Get("Retry-After") == "" || !strings.Contains(string(r.body), "large request bodies") {
		t.Fatalf("a fifth large body: %d %q %.300s, want 503 with Retry-After", r.status, r.header.Get("Retry-After"), r.body)
	}
	if r := e.do("PATCH", "/v1/messages/none", `{"delay":"1h"}`); r.status != http.StatusNotFound {
		t.Fatalf("a short body beside them: %d %.300s, want 404 (no such message)", r.status, r.body)
	}
	// Of unknown length (chunked) to a route of short bodies: beside them.
	req, err := http.NewRequest("PATCH", e.url+"/v1/messages/none", io.NopCloser(strings.NewReader(`{"delay":"1h"}`)))
	if err != nil {
		t.Fatal(err)
	}
	req.Header.Set("Content-Type", "application/json")
	req.ContentLength = -1 // sent chunked
	resp, err := http.DefaultClient.Do(req)
	if err != nil {
		t.Fatal(err)
	}
	resp.Body.Close()
	if resp.StatusCode != http.StatusNotFound {
		t.Fatalf("a short chunked body beside them: %d, want 404", resp.StatusCode)
	}
	holders[0].Close()
	testenv.Eventually(t, 10*time.Second, func() bool { return !full() }, "the share of a body whose client went freed")
	if r := e.do("POST", "/v1/messages", big); r.status != http.StatusCreated {
		t.Fatalf("a large body once one went: %d %.300s, want 201", r.status, r.body)
	}
}
