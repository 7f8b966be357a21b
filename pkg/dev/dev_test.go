package dev

import (
	"context"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"regexp"
	"runtime"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/delaybridge/delaybridge/internal/testenv"
	"github.com/delaybridge/delaybridge/pkg/config"
	"github.com/delaybridge/delaybridge/pkg/daemon"
)

// syncBuffer is what a logger writes while the test reads it.
type syncBuffer = testenv.Output

// runDev runs dev until the welcome message (5 s delay) has fired and been
// printed, then stops it, and returns what it printed (its banner, its
// notes and the daemon's log at dev's level, warn).
func runDev(t *testing.T) string {
	t.Helper()
	out := &syncBuffer{}
	ctx, cancel := context.WithCancel(context.Background())
	done := make(chan error, 1)
	go func() {
		done <- Run(ctx, Options{Dir: t.TempDir(), Out: out, Log: daemon.NewLogger(config.Log{Level: "warn", Format: "text"}, out), SelfPath: "delaybridge"})
	}()
	if !testenv.Poll(30*time.Second, func() bool { return strings.Contains(out.String(), `body="hello from delaybridge"`) }) {
		cancel()
		<-done
		t.Fatalf("the welcome message did not fire; output:\n%s", out.String())
	}
	cancel()
	if err := <-done; err != nil {
		t.Fatalf("dev stopped with %v", err)
	}
	return out.String()
}

// The quickstart end to end with the in-process Redis a machine without
// redis-server gets, the harder case (it reads no Lua script flags): the
// welcome message fires, dev says it runs without the real Redis, and the
// daemon warns about nothing dev chose.
func TestDevFiresWithTheInProcessRedis(t *testing.T) {
	t.Setenv("PATH", t.TempDir()) // no redis-server: the fallback
	out := runDev(t)
	if !strings.Contains(out, "miniredis") {
		t.Errorf("no note about the in-process Redis:\n%s", out)
	}
	if strings.Contains(out, "level=WARN") || strings.Contains(out, "level=ERROR") {
		t.Errorf("dev's daemon warned about dev's own set-up:\n%s", out)
	}
}

// With redis-server the quickstart prints no warning at all, and leaves an
// env file that points at its admin API with its token.
func TestDevWithRedisServerWarnsOfNothing(t *testing.T) {
	if testing.Short() {
		t.Skip("starts redis-server")
	}
	if _, err := exec.LookPath("redis-server"); err != nil {
		t.Skip("redis-server is not installed (make deps installs it)")
	}
	dir := t.TempDir()
	out := &syncBuffer{}
	ctx, cancel := context.WithCancel(context.Background())
	done := make(chan error, 1)
	go func() {
		done <- Run(ctx, Options{Dir: dir, Out: out, Log: daemon.NewLogger(config.Log{Level: "warn", Format: "text"}, out), SelfPath: "delaybridge", NoWelcome: true})
	}()
	envPath := filepath.Join(dir, EnvFile)
	if !testenv.Poll(30*time.Second, func() bool { return strings.Contains(out.String(), "Ctrl-C stops everything") }) {
		cancel()
		<-done
		t.Fatalf("dev did not start; output:\n%s", out.String())
	}
	env, err := os.ReadFile(envPath)
	cancel()
	if err := <-done; err != nil {
		t.Fatalf("dev stopped with %v", err)
	}
	if err != nil {
		t.Fatal(err)
	}
	token, _ := os.ReadFile(filepath.Join(dir, TokenFile))
	for _, want := range []string{"export DB=http://127.0.0.1:", "export DELAYBRIDGE_ADMIN=http://127.0.0.1:", "export DELAYBRIDGE_ADMIN_TOKEN=" + strings.TrimSpace(string(token)), `export AUTH="Authorization: Bearer $DELAYBRIDGE_ADMIN_TOKEN"`} {
		if len(token) < 16 || !strings.Contains(string(env), want) {
			t.Errorf("the env file lacks %q:\n%s", want, env)
		}
	}
	if strings.Contains(out.String(), "WARN") {
		t.Errorf("dev printed a warning:\n%s", out.String())
	}
	if _, err := config.Load(filepath.Join(dir, ConfigFile)); err != nil {
		t.Errorf("the config dev wrote: %v", err)
	}
}

// `go run ./cmd/delaybridge dev` stopped by its PID (the go command goes,
// dev stays) must not leave dev and its redis-server running: dev ends when
// the process that started it goes away, and its redis-server with it.
// The parent here is a shell, killed with SIGKILL.
func TestDevEndsWithTheProcessThatStartedIt(t *testing.T) {
	if runtime.GOOS != "linux" {
		t.Skip("reads /proc; the parent-death signal is Linux's")
	}
	if _, err := exec.LookPath("redis-server"); err != nil {
		t.Skip("redis-server is not installed (make deps installs it)")
	}
	bin := testenv.Build(t)
	dir := t.TempDir()
	devOut := filepath.Join(dir, "dev.out")
	parent := testenv.StartProcess(t, "/bin/sh", "-c", `"$0" dev --dir "$1" --quiet >"$2" 2>&1 & echo "dev $!"; wait`, bin, filepath.Join(dir, "state"), devOut)
	parent.WaitOutput(10*time.Second, "dev ")
	pid, err := strconv.Atoi(regexp.MustCompile(`dev (\d+)`).FindStringSubmatch(parent.Output())[1])
	if err != nil {
		t.Fatal(err)
	}
	out := func() string { b, _ := os.ReadFile(devOut); return string(b) }
	testenv.Eventually(t, 60*time.Second, func() bool { return strings.Contains(out(), "Ctrl-C stops everything") }, "dev did not start: %s", out)
	redisPID := 0
	for _, c := range children(pid) {
		if comm(c) == "redis-server" {
			redisPID = c
		}
	}
	if redisPID == 0 {
		t.Fatalf("no redis-server child of dev %d; output:\n%s", pid, out())
	}

	parent.Kill() // SIGKILL: the parent cannot pass anything on
	testenv.Eventually(t, 30*time.Second, func() bool { return !alive(pid) && !alive(redisPID) },
		"dev %d or its redis-server %d still runs after its parent was killed", pid, redisPID)
}

// alive reports whether pid runs (a zombie does not).
func alive(pid int) bool {
	b, err := os.ReadFile(fmt.Sprintf("/proc/%d/stat", pid))
	if err != nil {
		return false
	}
	// "pid (comm) state ...": comm may hold spaces and parentheses.
	s := string(b)
	return !strings.HasPrefix(strings.TrimSpace(s[strings.LastIndexByte(s, ')')+1:]), "Z")
}

// children lists pid's child processes (Linux).
func children(pid int) []int {
	var out []int
	tasks, _ := filepath.Glob(fmt.Sprintf("/proc/%d/task/*/children", pid))
	for _, f := range tasks {
		b, _ := os.ReadFile(f)
		for _, field := range strings.Fields(string(b)) {
			if c, err := strconv.Atoi(field); err == nil {
				out = append(out, c)
			}
		}
	}
	return out
}

func comm(pid int) string {
	b, _ := os.ReadFile(fmt.Sprintf("/proc/%d/comm", pid))
	return strings.TrimSpace(string(b))
}
