// Package testenv starts REAL servers on loopback for the tests of this repository:
// redis-server (single node and cluster), an embedded nats-server with JetStream,
// an in-process kfake Kafka cluster, and a throwaway rabbitmq-server node. It also
// builds and runs the delaybridge binary for end-to-end tests.
//
// Rules every helper follows:
//
//   - Servers listen on 127.0.0.1 only, on ports that never are the system
//     defaults (6379, 5672, 4369, 4222, 9092). Ports come from a reservation scheme
//     (see reservePorts) that is safe when `go test ./...` runs several test
//     binaries at once: each reserved port is held with an flock(2) lock file
//     in os.TempDir(), so two test processes never hand out the same port.
//   - All server state lives in t.TempDir() (or, for the shared RabbitMQ node, a
//     temp dir removed by Main).
//   - Child processes are started with Pdeathsig, so they die with the test binary
//     even when it is killed by `go test -timeout` and t.Cleanup never runs.
//   - A missing server binary FAILS the test, telling to run scripts/test-deps.sh.
//     Nothing here calls t.Skip.
//   - Waiting is done by polling with a deadline (Eventually), never by a bare sleep.
//
// A test package that uses RabbitMQ or Build should have
//
//	func TestMain(m *testing.M) { os.Exit(testenv.Main(m)) }
//
// so that the shared node and the build directory are removed at the end.
package testenv

import (
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"testing"
	"time"
)

// depsHint is appended to every "binary not found" failure.
const depsHint = "install the test dependencies with: sudo bash scripts/test-deps.sh"

// FreePort returns a TCP port on 127.0.0.1 that is free now and reserved for this test
// until its cleanup runs: no other caller of this package, in this process or in
// another test binary running concurrently, gets it meanwhile. The port lies in
// [20000, 32000), below the kernel's ephemeral range, so outgoing connections do not
// take it either; it can therefore be re-bound after a process restart.
//
// Caveat: a program that does not use this package can still bind the port between
// FreePort returning and the caller binding it.
func FreePort(t testing.TB) int {
	t.Helper()
	return reservePorts(t, portLo, portHi)
}

// skipShort skips the test under `go test -short`, which runs only the tests
// that need no server (about a minute; see the Makefile's short target).
// `make test` never passes -short: there a missing server fails the test.
func skipShort(t testing.TB, what string) {
	t.Helper()
	if testing.Short() {
		t.Skipf("-short: this test needs %s", what)
	}
}

// Eventually calls cond every few milliseconds until it returns true, and fails the
// test with t.Fatalf if it has not by timeout. msgAndArgs is an optional fmt format
// and its arguments describing what was awaited. cond runs on the calling goroutine,
// so it may use t.Fatal itself; it should be quick (it is not interrupted).
func Eventually(t testing.TB, timeout time.Duration, cond func() bool, msgAndArgs ...any) {
	t.Helper()
	if !Poll(timeout, cond) {
		t.Fatalf("testenv.Eventually: condition not met within %v: %s", timeout, formatMsg(msgAndArgs))
	}
}

// Poll is Eventually without the test: it reports whether cond became true within
// timeout, for a caller that says more than Eventually can when it did not. It
// checks cond at once, then backs off from 2 ms to 50 ms between checks. Every
// wait for a condition in the tests goes through Poll or Eventually.
func Poll(timeout time.Duration, cond func() bool) bool {
	deadline := time.Now().Add(timeout)
	wait := 2 * time.Millisecond
	for {
		if cond() {
			return true
		}
		if time.Now().After(deadline) {
			return false
		}
		time.Sleep(wait) // pacing of the poll loop, not synchronisation
		if wait < 50*time.Millisecond {
			wait *= 2
		}
	}
}

func formatMsg(msgAndArgs []any) string {
	if len(msgAndArgs) == 0 {
		return "(no message)"
	}
	if f, ok := msgAndArgs[0].(string); ok {
		return fmt.Sprintf(f, msgAndArgs[1:]...)
	}
	return fmt.Sprint(msgAndArgs...)
}

// lookBinary finds a server binary: in PATH, then in the given fallback paths.
// It fails the test (never skips) with a hint to run scripts/test-deps.sh.
func lookBinary(t testing.TB, name string, fallbacks ...string) string {
	t.Helper()
	if p, err := exec.LookPath(name); err == nil {
		return p
	}
	for _, f := range fallbacks {
		if st, err := os.Stat(f); err == nil && !st.IsDir() && st.Mode()&0o111 != 0 {
			return f
		}
	}
	t.Fatalf("testenv: %s not found in PATH nor at %s; %s", name, strings.Join(fallbacks, ", "), depsHint)
	return ""
}

// tail returns the last n bytes of a file (for failure messages), or a note why not.
func tail(path string, n int64) string {
	f, err := os.Open(path)
	if err != nil {
		return fmt.Sprintf("(cannot read %s: %v)", path, err)
	}
	defer f.Close()
	st, err := f.Stat()
	if err != nil {
		return fmt.Sprintf("(cannot stat %s: %v)", path, err)
	}
	off := st.Size() - n
	if off < 0 {
		off = 0
	}
	buf := make([]byte, st.Size()-off)
	if _, err := f.ReadAt(buf, off); err != nil {
		return fmt.Sprintf("(cannot read %s: %v)", path, err)
	}
	return string(buf)
}

// ModuleRoot is the module's root directory, the one holding go.mod above
// the test's working directory (its package's directory).
func ModuleRoot(t testing.TB) string {
	t.Helper()
	root, err := moduleRoot()
	if err != nil {
		t.Fatal(err)
	}
	return root
}

// moduleRoot walks up from the working directory to the directory holding go.mod.
func moduleRoot() (string, error) {
	dir, err := os.Getwd()
	if err != nil {
		return "", err
	}
	for {
		if _, err := os.Stat(filepath.Join(dir, "go.mod")); err == nil {
			return dir, nil
		}
		parent := filepath.Dir(dir)
		if parent == dir {
			return "", fmt.Errorf("no go.mod above the working directory")
		}
		dir = parent
	}
}
