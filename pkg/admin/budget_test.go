package admin

import (
	"bufio"
	"context"
	"net"
	"net/http"
	"net/http/httptest"
	"strings"
	"testing"
	"time"
)

// Large bodies take turns within the budget (two of the largest document
// at once); one that cannot have its share before its request ends gets
// 503 with Retry-After; a request without a body takes nothing.
func TestBodyBudgetTakesTurns(t *testing.T) {
	b := newBodyBudget(maxSmallBody)
	req := func(n int64, ctx context.Context) *http.Request {
		r := httptest.NewRequestWithContext(ctx, http.MethodPost, "/v1/messages", nil)
		r.ContentLength = n
		return r
	}
	bg := context.Background()
	rel1, ok1 := b.take(httptest.NewRecorder(), req(maxSmallBody, bg))
	rel2, ok2 := b.take(httptest.NewRecorder(), req(-1, bg)) // unknown size: the largest
	if !ok1 || !ok2 {
		t.Fatal("two of the largest bodies did not fit the budget")
	}
	if rel, ok := b.take(httptest.NewRecorder(), req(0, bg)); !ok {
		t.Fatal("a request without a body waited for the budget")
	} else {
		rel()
	}
	short, cancel := context.WithTimeout(bg, 50*time.Millisecond)
	defer cancel()
	w := httptest.NewRecorder()
	if _, ok := b.take(w, req(1, short)); ok || w.Code != http.StatusServiceUnavailable || w.Header().Get("Retry-After") == "" {
		t.Fatalf("a third body with the budget spent: ok %v, %d %q, want 503 with Retry-After", ok, w.Code, w.Header().Get("Retry-After"))
	}
	taken := make(chan func())
	go func() {
		rel, _ := b.take(httptest.NewRecorder(), req(maxSmallBody, bg))
		taken <- rel
	}()
	rel1()
	select {
	case rel := <-taken:
		rel()
	case <-time.After(10 * time.Second):
		t.Fatal("a body waiting for its turn did not get it when one was done")
	}
	rel2()
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
	resp, err := http.ReadResponse(bufio.NewReader(conn), nil)
	if err != nil {
		t.Fatalf("no answer within 10 s to a request whose body never came: %v", err)
	}
	defer resp.Body.Close()
	if resp.StatusCode != http.StatusUnauthorized || !resp.Close {
		t.Fatalf("answer %d, closing %v; want 401 and the connection closed", resp.StatusCode, resp.Close)
	}
}
