// Package dev runs delaybridge end to end on one machine for a first look
// (`delaybridge dev`): an embedded NATS server with JetStream as ingest and
// sink, Redis (a redis-server child process when one is installed, else an
// in-process Redis-protocol server that keeps nothing across restarts), and
// the daemon itself. It prints every message that fires.
package dev

import (
	"context"
	"errors"
	"fmt"
	"io"
	"log/slog"
	"net"
	"os"
	"os/exec"
	"path/filepath"
	"strconv"
	"strings"
	"time"

	"github.com/alicebob/miniredis/v2"
	"github.com/nats-io/nats-server/v2/server"
	"github.com/nats-io/nats.go"
	"github.com/redis/go-redis/v9"

	"github.com/delaybridge/delaybridge/pkg/brokers"
	"github.com/delaybridge/delaybridge/pkg/config"
	"github.com/delaybridge/delaybridge/pkg/daemon"
	"github.com/delaybridge/delaybridge/pkg/envelope"
)

// Options of a dev run.
type Options struct {
	Dir       string // state directory (config, NATS and Redis data)
	Out       io.Writer
	Log       *slog.Logger
	SelfPath  string // how to invoke this binary, for the printed hints
	NoWelcome bool   // do not send the welcome message
}

// Run starts everything and blocks until ctx ends.
func Run(ctx context.Context, o Options) error {
	dir, err := filepath.Abs(o.Dir)
	if err != nil {
		return err
	}
	o.Dir = dir
	if err := os.MkdirAll(o.Dir, 0o755); err != nil {
		return err
	}
	out := o.Out

	ns, err := startNATS(filepath.Join(o.Dir, "nats"))
	if err != nil {
		return fmt.Errorf("embedded nats: %w", err)
	}
	defer ns.Shutdown()
	natsURL := ns.ClientURL()

	redisAddr, stopRedis, err := startRedis(ctx, filepath.Join(o.Dir, "redis"), out)
	if err != nil {
		return fmt.Errorf("redis: %w", err)
	}
	defer stopRedis()

	adminListen := "127.0.0.1:7070"
	if !portFree(adminListen) {
		adminListen = "127.0.0.1:0"
	}
	cfgPath := filepath.Join(o.Dir, "config.yaml")
	cfgText := fmt.Sprintf(configTemplate, redisAddr, adminListen, natsURL, natsURL)
	if err := os.WriteFile(cfgPath, []byte(cfgText), 0o644); err != nil {
		return err
	}
	cfg, err := config.Load(cfgPath)
	if err != nil {
		return fmt.Errorf("generated config: %w", err)
	}

	nc, err := nats.Connect(natsURL, nats.Name("delaybridge dev printer"))
	if err != nil {
		return err
	}
	defer nc.Close()
	if _, err := nc.Subscribe("fired.>", func(m *nats.Msg) { printFired(out, m) }); err != nil {
		return err
	}

	d, err := daemon.New(ctx, cfg, o.Log)
	if err != nil {
		return err
	}
	runErr := make(chan error, 1)
	go func() { runErr <- d.Run(ctx) }()

	admin := d.AdminAddr()
	for admin == "" || strings.HasSuffix(admin, ":0") {
		select {
		case err := <-runErr:
			return err
		case <-time.After(10 * time.Millisecond):
			admin = d.AdminAddr()
		}
	}
	fmt.Fprintf(out, `
delaybridge dev is running.
  NATS (JetStream)  %s   ingest subject delayed.>  (stream DELAYED); fired messages go to fired.<...>
  Redis             %s
  admin API         http://%s   (try /v1/stats, /metrics)
  config            %s

Send a message that fires in 10 seconds (from another terminal):
  %s send -c %s --ingest dev --delay 10s "hello again"
Send one to a subject of your choice, or at a fixed time:
  %s send -c %s --ingest dev --at %s --header x-delay-destination=fired.reminders "a reminder"
Look at what is parked:
  curl -s http://%s/v1/stats

Fired messages appear below. Ctrl-C stops everything.
`, natsURL, redisAddr, admin, cfgPath, o.SelfPath, cfgPath, o.SelfPath, cfgPath,
		time.Now().Add(time.Minute).UTC().Format(time.RFC3339), admin)

	if !o.NoWelcome {
		due := time.Now().Add(5 * time.Second)
		err := brokers.Send(ctx, cfg, brokers.SendRequest{Ingest: "dev", Delay: "5s", Body: []byte("hello from delaybridge")})
		if err != nil {
			fmt.Fprintf(out, "could not send the welcome message: %v\n", err)
		} else {
			fmt.Fprintf(out, "\nsent \"hello from delaybridge\" with x-delay: 5s; it fires at %s\n", due.Format("15:04:05.000"))
		}
	}
	return <-runErr
}

const configTemplate = `# Written by delaybridge dev. Every key is documented in config.example.yaml.
redis:
  addr: %s
  key_prefix: delaybridge-dev
admin:
  listen: %s
log:
  level: warn
ingest:
  - name: dev
    nats: {url: "%s", subject: "delayed.>", stream: DELAYED, durable: delaybridge}
    route:
      sink: nats
      destination: fired.dev
      allow_override: true
      allowed_destinations: ["fired.*"]
sinks:
  - name: nats
    nats: {url: "%s", jetstream: false}
`

func printFired(out io.Writer, m *nats.Msg) {
	line := fmt.Sprintf("%s  fired  subject=%s", time.Now().Format("15:04:05.000"), m.Subject)
	if due, err := time.Parse(time.RFC3339Nano, m.Header.Get(envelope.HeaderDueAt)); err == nil {
		line += fmt.Sprintf("  due=%s  late=%dms", due.Local().Format("15:04:05.000"), time.Since(due).Milliseconds())
	}
	line += fmt.Sprintf("  id=%s  attempt=%s  body=%q", m.Header.Get(envelope.HeaderMessageID), m.Header.Get(envelope.HeaderAttempt), truncate(m.Data, 200))
	fmt.Fprintln(out, line)
}

func truncate(b []byte, n int) string {
	if len(b) > n {
		return string(b[:n]) + "..."
	}
	return string(b)
}

func startNATS(dir string) (*server.Server, error) {
	port := 4222
	if !portFree("127.0.0.1:4222") {
		port = -1
	}
	ns, err := server.NewServer(&server.Options{
		Host: "127.0.0.1", Port: port, JetStream: true, StoreDir: dir, NoLog: true, NoSigs: true,
	})
	if err != nil {
		return nil, err
	}
	go ns.Start()
	if !ns.ReadyForConnections(10 * time.Second) {
		ns.Shutdown()
		return nil, errors.New("not ready after 10s")
	}
	return ns, nil
}

// startRedis starts redis-server from PATH as a child with its data in dir,
// or, when none is installed, an in-process Redis-protocol server.
func startRedis(ctx context.Context, dir string, out io.Writer) (string, func(), error) {
	bin, err := exec.LookPath("redis-server")
	if err != nil {
		m, err := miniredis.Run()
		if err != nil {
			return "", nil, err
		}
		fmt.Fprintln(out, "WARNING: redis-server is not installed; using an in-process Redis-protocol server (miniredis).\n"+
			"         Nothing parked survives a restart. Install Redis for the real thing: apt-get install -y redis-server")
		return m.Addr(), m.Close, nil
	}
	if err := os.MkdirAll(dir, 0o755); err != nil {
		return "", nil, err
	}
	port := freePort()
	addr := "127.0.0.1:" + strconv.Itoa(port)
	cmd := exec.Command(bin, "--port", strconv.Itoa(port), "--bind", "127.0.0.1", "--dir", dir,
		"--appendonly", "yes", "--save", "", "--logfile", filepath.Join(dir, "redis.log"))
	if err := cmd.Start(); err != nil {
		return "", nil, err
	}
	stop := func() {
		_ = cmd.Process.Signal(os.Interrupt)
		done := make(chan struct{})
		go func() { _ = cmd.Wait(); close(done) }()
		select {
		case <-done:
		case <-time.After(5 * time.Second):
			_ = cmd.Process.Kill()
			<-done
		}
	}
	rdb := redis.NewClient(&redis.Options{Addr: addr})
	defer rdb.Close()
	deadline := time.Now().Add(10 * time.Second)
	for {
		if err := rdb.Ping(ctx).Err(); err == nil {
			return addr, stop, nil
		}
		if time.Now().After(deadline) {
			stop()
			return "", nil, fmt.Errorf("redis-server on %s did not answer within 10s; see %s", addr, filepath.Join(dir, "redis.log"))
		}
		time.Sleep(20 * time.Millisecond) // polling a child process with a deadline
	}
}

func portFree(addr string) bool {
	l, err := net.Listen("tcp", addr)
	if err != nil {
		return false
	}
	_ = l.Close()
	return true
}

func freePort() int {
	l, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		return 6379
	}
	defer l.Close()
	return l.Addr().(*net.TCPAddr).Port
}
