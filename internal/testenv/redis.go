package testenv

import (
	"bufio"
	"context"
	"errors"
	"fmt"
	"net"
	"os"
	"os/exec"
	"path/filepath"
	"strconv"
	"strings"
	"sync"
	"syscall"
	"testing"
	"time"

	"github.com/redis/go-redis/v9"
)

// redisReadyTimeout bounds the wait for PONG after a (re)start. An AOF replay takes
// about 1 s per 50 MB here, so this leaves room for large data sets.
const redisReadyTimeout = 60 * time.Second

type redisConfig struct {
	port         int
	fsync        string
	args         []string
	readyTimeout time.Duration
}

// RedisOption configures Redis.
type RedisOption func(*redisConfig)

// WithAppendFsync sets --appendfsync ("always", "everysec" (default) or "no").
func WithAppendFsync(policy string) RedisOption {
	return func(c *redisConfig) { c.fsync = policy }
}

// WithArgs appends raw redis-server command-line arguments, e.g.
// WithArgs("--maxmemory-policy", "noeviction"). They come last, so they override the
// defaults (e.g. WithArgs("--appendonly", "no")).
func WithArgs(args ...string) RedisOption {
	return func(c *redisConfig) { c.args = append(c.args, args...) }
}

// WithReadyTimeout bounds the wait for PONG after each (re)start instead of the
// default minute: a restart replaying gigabytes of AOF takes longer.
func WithReadyTimeout(d time.Duration) RedisOption {
	return func(c *redisConfig) { c.readyTimeout = d }
}

// WithPort makes the server listen on port instead of a reserved free one. The caller
// is responsible for the port being free and unique; prefer the default.
func WithPort(port int) RedisOption {
	return func(c *redisConfig) { c.port = port }
}

// RedisServer is a private redis-server process. Its methods must be called from the
// test goroutine (they may call t.Fatal).
type RedisServer struct {
	Addr    string // "127.0.0.1:PORT"
	Port    int
	Dir     string // working directory: AOF (appendonlydir/), logfile, cluster config
	LogFile string // redis-server's logfile, inside Dir

	t            testing.TB
	bin          string
	args         []string
	readyTimeout time.Duration

	mu   sync.Mutex
	proc *child
}

// child is a started process and the channel closed when it has exited.
type child struct {
	cmd  *exec.Cmd
	done chan struct{}
	err  error // cmd.Wait's result, valid after done is closed
}

func startWatched(cmd *exec.Cmd, deathSig syscall.Signal) (*child, error) {
	if err := startChild(cmd, deathSig); err != nil {
		return nil, err
	}
	c := &child{cmd: cmd, done: make(chan struct{})}
	go func() {
		c.err = cmd.Wait()
		close(c.done)
	}()
	return c, nil
}

func (c *child) exited() bool {
	select {
	case <-c.done:
		return true
	default:
		return false
	}
}

// waitExit waits up to d for the process to exit and reports whether it did.
func (c *child) waitExit(d time.Duration) bool {
	select {
	case <-c.done:
		return true
	case <-time.After(d):
		return false
	}
}

// Redis starts a private redis-server on a free 127.0.0.1 port with its data in
// t.TempDir(): `--save "" --appendonly yes --appendfsync everysec`, logfile in the dir.
// It returns once the server answers PING, and kills it in t.Cleanup.
//
// The binary is redis-server from PATH, else /usr/bin/redis-server; if neither exists
// the test fails with a hint to run scripts/test-deps.sh.
//
// Caveat: Redis 7.0 (Debian 12) has no WAITAOF; with the default everysec policy up to
// about a second of acknowledged writes is lost by Kill. Use WithAppendFsync("always")
// when a test kills the server and expects every acknowledged write back.
func Redis(t testing.TB, opts ...RedisOption) *RedisServer {
	skipShort(t, "redis-server")
	t.Helper()
	cfg := redisConfig{fsync: "everysec"}
	for _, o := range opts {
		o(&cfg)
	}
	bin := lookBinary(t, "redis-server", "/usr/bin/redis-server")
	if cfg.port == 0 {
		cfg.port = reservePorts(t, portLo, portHi)
	}
	dir := t.TempDir()
	args := []string{
		"--port", strconv.Itoa(cfg.port),
		"--bind", "127.0.0.1",
		"--dir", dir,
		"--logfile", filepath.Join(dir, "redis.log"),
		"--daemonize", "no",
		"--save", "",
		"--appendonly", "yes",
		"--appendfsync", cfg.fsync,
	}
	args = append(args, cfg.args...)
	return newRedisServerAt(t, bin, cfg.port, dir, args, cfg.readyTimeout)
}

func newRedisServer(t testing.TB, bin string, port int, dir string, args []string) *RedisServer {
	t.Helper()
	return newRedisServerAt(t, bin, port, dir, args, 0)
}

// newRedisServerAt is newRedisServer with a wait for PONG other than
// redisReadyTimeout (0: the default).
func newRedisServerAt(t testing.TB, bin string, port int, dir string, args []string, readyTimeout time.Duration) *RedisServer {
	t.Helper()
	if readyTimeout <= 0 {
		readyTimeout = redisReadyTimeout
	}
	r := &RedisServer{
		readyTimeout: readyTimeout,
		Addr:         net.JoinHostPort("127.0.0.1", strconv.Itoa(port)),
		Port:         port,
		Dir:          dir,
		LogFile:      filepath.Join(dir, "redis.log"),
		t:            t,
		bin:          bin,
		args:         args,
	}
	t.Cleanup(func() {
		if t.Failed() {
			t.Logf("testenv: redis %s log tail:\n%s", r.Addr, tail(r.LogFile, 2000))
		}
		r.Kill()
	})
	r.Start()
	return r
}

// Start starts the server again on the same port and directory (so it replays its
// AOF) and waits until PING answers PONG, i.e. not LOADING. It fails the test if the
// server is already running or does not come up within a minute.
func (r *RedisServer) Start() {
	r.t.Helper()
	r.mu.Lock()
	if r.proc != nil && !r.proc.exited() {
		r.mu.Unlock()
		r.t.Fatalf("testenv: redis %s: Start while running", r.Addr)
	}
	cmd := exec.Command(r.bin, r.args...)
	cmd.Dir = r.Dir
	out, err := os.OpenFile(filepath.Join(r.Dir, "stdout.log"), os.O_CREATE|os.O_WRONLY|os.O_APPEND, 0o644)
	if err != nil {
		r.mu.Unlock()
		r.t.Fatalf("testenv: redis: %v", err)
	}
	cmd.Stdout, cmd.Stderr = out, out
	proc, err := startWatched(cmd, syscall.SIGKILL)
	out.Close()
	if err != nil {
		r.mu.Unlock()
		r.t.Fatalf("testenv: start %s: %v", r.bin, err)
	}
	r.proc = proc
	r.mu.Unlock()

	var last string
	ok := Poll(r.readyTimeout, func() bool {
		if proc.exited() {
			return true
		}
		reply, err := rawPing(r.Addr)
		if err != nil {
			last = err.Error()
			return false
		}
		last = reply
		return reply == "+PONG" || strings.HasPrefix(reply, "-NOAUTH") // up; it wants a password
	})
	if proc.exited() {
		r.t.Fatalf("testenv: redis-server on %s exited at start (%v); log tail:\n%s\nstdout:\n%s",
			r.Addr, proc.err, tail(r.LogFile, 2000), tail(filepath.Join(r.Dir, "stdout.log"), 1000))
	}
	if !ok {
		r.t.Fatalf("testenv: redis-server on %s not ready after %v (last: %s); log tail:\n%s",
			r.Addr, r.readyTimeout, last, tail(r.LogFile, 2000))
	}
}

// Stop shuts the server down gracefully (SIGTERM: Redis flushes the AOF and exits)
// and waits for it; after 15 s it falls back to SIGKILL. No-op if not running.
func (r *RedisServer) Stop() { r.stop(syscall.SIGTERM, 15*time.Second) }

// Signal sends sig to the running server's process: SIGSTOP makes a server
// that hangs (it takes connections and answers nothing), SIGCONT ends
// that. Continue a stopped server before the test ends: its cleanup's
// SIGTERM waits for it.
func (r *RedisServer) Signal(sig syscall.Signal) {
	r.mu.Lock()
	proc := r.proc
	r.mu.Unlock()
	if proc == nil {
		r.t.Fatalf("testenv: %s is not running", r)
	}
	if err := proc.cmd.Process.Signal(sig); err != nil {
		r.t.Fatalf("testenv: signal %v to %s: %v", sig, r, err)
	}
}

// Kill sends SIGKILL and waits for the process to exit: a crash. With the default
// appendfsync everysec the last second of writes may be lost. No-op if not running.
func (r *RedisServer) Kill() { r.stop(syscall.SIGKILL, 15*time.Second) }

func (r *RedisServer) stop(sig syscall.Signal, grace time.Duration) {
	r.mu.Lock()
	proc := r.proc
	r.mu.Unlock()
	if proc == nil || proc.exited() {
		return
	}
	_ = proc.cmd.Process.Signal(sig)
	if proc.waitExit(grace) {
		return
	}
	killGroup(proc.cmd.Process.Pid, syscall.SIGKILL)
	if !proc.waitExit(grace) {
		r.t.Errorf("testenv: redis-server %s (pid %d) did not exit after SIGKILL", r.Addr, proc.cmd.Process.Pid)
	}
}

// Running reports whether the process is alive (not whether it answers).
func (r *RedisServer) Running() bool {
	r.mu.Lock()
	defer r.mu.Unlock()
	return r.proc != nil && !r.proc.exited()
}

// Client returns a new go-redis client for this server, closed in t.Cleanup.
// After Kill/Start the client reconnects by itself; commands issued while the server
// is down fail.
func (r *RedisServer) Client() *redis.Client {
	c := redis.NewClient(&redis.Options{Addr: r.Addr})
	r.t.Cleanup(func() { _ = c.Close() })
	return c
}

// rawPing sends PING over a fresh connection and returns the first reply line, e.g.
// "+PONG" or "-LOADING Redis is loading the dataset in memory".
func rawPing(addr string) (string, error) {
	conn, err := net.DialTimeout("tcp", addr, time.Second)
	if err != nil {
		return "", err
	}
	defer conn.Close()
	_ = conn.SetDeadline(time.Now().Add(2 * time.Second))
	if _, err := conn.Write([]byte("PING\r\n")); err != nil {
		return "", err
	}
	line, err := bufio.NewReader(conn).ReadString('\n')
	if err != nil {
		return "", err
	}
	line = strings.TrimRight(line, "\r\n")
	if line == "" {
		return "", errors.New("empty reply")
	}
	return line, nil
}

// String describes the server for failure messages.
func (r *RedisServer) String() string { return fmt.Sprintf("redis-server %s (dir %s)", r.Addr, r.Dir) }

// CommandStat is a command's line of INFO commandstats: how many times it
// ran and the µs Redis spent in it (for EVAL and EVALSHA, with the
// commands their scripts ran).
type CommandStat struct{ Calls, Usec float64 }

// CommandStats returns INFO commandstats by command ("evalsha", "zadd",
// "config|get"); a command not run yet is absent.
func CommandStats(rdb redis.UniversalClient) (map[string]CommandStat, error) {
	info, err := rdb.Info(context.Background(), "commandstats").Result()
	if err != nil {
		return nil, err
	}
	out := map[string]CommandStat{}
	for _, line := range strings.Split(info, "\n") {
		name, fields, ok := strings.Cut(strings.TrimSpace(line), ":")
		name, found := strings.CutPrefix(name, "cmdstat_")
		if !ok || !found {
			continue
		}
		var c CommandStat
		for _, f := range strings.Split(fields, ",") {
			k, v, _ := strings.Cut(f, "=")
			x, _ := strconv.ParseFloat(v, 64)
			switch k {
			case "calls":
				c.Calls = x
			case "usec":
				c.Usec = x
			}
		}
		out[name] = c
	}
	return out, nil
}
