package cli

import (
	"fmt"
	"io"
	"os"
	"strings"
	"syscall"
	"testing"

	"github.com/delaybridge/delaybridge/internal/testenv"
)

// A command whose Redis is down says so in one line: the Redis client's
// own log lines (a pool's dial failures) do not reach stderr. go-redis
// writes them to file descriptor 2 of the process, not to Main's stderr,
// so the test points that descriptor at a pipe while the command runs.
func TestRedisDownIsOneLine(t *testing.T) {
	down := fmt.Sprintf("127.0.0.1:%d", testenv.FreePort(t))
	cfg := writeConfig(t, fmt.Sprintf(`
redis: {addr: "%s", key_prefix: down, dial_timeout: 200ms}
sinks: [{name: s, nats: {url: "nats://127.0.0.1:4222"}}]
`, down))
	r, w, err := os.Pipe()
	if err != nil {
		t.Fatal(err)
	}
	saved, err := syscall.Dup(2)
	if err != nil {
		t.Fatal(err)
	}
	restore := func() { // once, even on a panic: a test's failure must be seen
		if saved >= 0 {
			_ = syscall.Dup3(saved, 2, 0)
			_ = syscall.Close(saved)
			saved = -1
		}
	}
	defer restore()
	if err := syscall.Dup3(int(w.Fd()), 2, 0); err != nil {
		t.Fatal(err)
	}
	// The pipe is read while the command runs: a full pipe would block it.
	read := make(chan []byte)
	go func() { b, _ := io.ReadAll(r); read <- b }()
	code, _, errOut := run(t, "list", "-c", cfg)
	restore()
	w.Close()
	stray := <-read
	if code != 1 || strings.Count(strings.TrimSpace(errOut), "\n") != 0 || !strings.HasPrefix(errOut, "delaybridge: ") {
		t.Errorf("list with Redis down: exit %d, stderr %q, want 1 and one line", code, errOut)
	}
	if len(stray) > 0 {
		t.Errorf("the Redis client printed to stderr:\n%s", stray)
	}
}
