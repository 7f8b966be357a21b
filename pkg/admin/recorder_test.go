package admin

import (
	"bytes"
	"log"
	"net/http"
	"net/http/httptest"
	"strings"
	"sync"
	"testing"
)

// A second status written through the recorder (an error met after the
// answer began) is dropped without Go's "superfluous
// response.WriteHeader" line, and the first is what the client gets and
// the request log says.
func TestRecorderDropsASecondStatus(t *testing.T) {
	var mu sync.Mutex
	var logged bytes.Buffer
	var rec *recorder
	srv := httptest.NewUnstartedServer(http.HandlerFunc(func(w http.ResponseWriter, _ *http.Request) {
		rec = &recorder{ResponseWriter: w}
		rec.WriteHeader(http.StatusOK)
		_, _ = rec.Write([]byte("{}"))
		rec.WriteHeader(http.StatusInternalServerError)
	}))
	srv.Config.ErrorLog = log.New(writerFunc(func(p []byte) (int, error) {
		mu.Lock()
		defer mu.Unlock()
		return logged.Write(p)
	}), "", 0)
	srv.Start()
	defer srv.Close()
	resp, err := http.Get(srv.URL)
	if err != nil {
		t.Fatal(err)
	}
	resp.Body.Close()
	srv.Close() // the handler and its logging are done
	mu.Lock()
	defer mu.Unlock()
	if resp.StatusCode != http.StatusOK || rec.status != http.StatusOK || strings.Contains(logged.String(), "superfluous") {
		t.Fatalf("status %d, recorded %d, server log %q", resp.StatusCode, rec.status, logged.String())
	}
}

type writerFunc func([]byte) (int, error)

func (f writerFunc) Write(p []byte) (int, error) { return f(p) }
